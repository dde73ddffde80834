#!/usr/bin/env node
'use strict';

/**
 * Batched embeddings (`npm run bench:embeddings`, issue 60), in one run on one context of
 * nomic-embed-text-v1.5 (fetched by name): `--texts` short documents embedded one `encode` each
 * against one `embedBatch` (as many per decode as the context has sequences, `--seqs`),
 * interleaved `--reps` times (medians), and the worst cosine between the two ways' vectors.
 *
 * With --servers also the same texts as one POST /v1/embeddings to `llama-branch serve
 * --embeddings` and to llama.cpp's server (the pinned xllamacpp wheel, 8 slots, embedding mode),
 * both on the same encoder and threads, alternating `--reps` times: texts/s.
 *
 * Flags: --texts=64 --seqs=8 --reps=3 --threads=2 --servers --json
 */

const path = require('node:path');
const { createContext } = require('..');
const { ensureModel } = require('../scripts/fetch-model');
const { args, median, freePort, startProcess, stopProcess, startLlamaCppServer } = require('./common');

const TEXTS = Number(args.texts || 64);
const SEQS = Number(args.seqs || 8);
const REPS = Number(args.reps || 3);
const THREADS = Number(args.threads || 2);
const TOPICS = ['rivers', 'clocks', 'mosses', 'ledgers'];

const cosine = (a, b) => a.reduce((sum, x, i) => sum + x * b[i], 0);

/** texts/s of one POST /v1/embeddings of `texts` to each server, alternating, medians of REPS. */
async function servers(modelPath, texts) {
  const starts = {
    ours: async (port) => {
      const bin = path.join(__dirname, '..', 'bin', 'llama-branch.js');
      const argv = [bin, 'serve', '--model', modelPath, '--embeddings', '--port', String(port)];
      argv.push('--threads', String(THREADS), '--ctx-size', '2048', '--no-ui');
      return startProcess(process.execPath, argv, port);
    },
    llamaCpp: (port) =>
      startLlamaCppServer({
        model: modelPath,
        threads: THREADS,
        port,
        parallel: SEQS,
        nCtx: 2048 * SEQS,
        embedding: true,
      }),
  };
  const up = {};
  for (const [name, start] of Object.entries(starts)) up[name] = await start(await freePort());
  const rates = { ours: [], llamaCpp: [] };
  try {
    const send = async (url) => {
      const t0 = performance.now();
      const res = await fetch(`${url}/v1/embeddings`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ input: texts, model: path.basename(modelPath, '.gguf') }),
      });
      const body = await res.json();
      if (!res.ok || body.data.length !== texts.length)
        throw new Error(`${url}: ${JSON.stringify(body).slice(0, 300)}`);
      return (texts.length / (performance.now() - t0)) * 1000;
    };
    for (const name of Object.keys(up)) await send(up[name].url); // warm-up
    for (let rep = 0; rep < REPS; rep++)
      for (const name of rep % 2 ? ['llamaCpp', 'ours'] : ['ours', 'llamaCpp'])
        rates[name].push(await send(up[name].url));
  } finally {
    for (const s of Object.values(up)) await stopProcess(s.child);
  }
  const [ours, llamaCpp] = [median(rates.ours), median(rates.llamaCpp)];
  return { oursTextsS: ours, llamaCppTextsS: llamaCpp, ratio: ours / llamaCpp, rates };
}

async function main() {
  const modelPath = ensureModel('nomic-embed-text-v1.5');
  const ctx = await createContext({
    modelPath,
    embeddings: true,
    nCtx: 2048,
    nBatch: 2048,
    nSeqMax: SEQS,
    nThreads: THREADS,
  });
  const texts = Array.from(
    { length: TEXTS },
    (_, i) => `search_document: item ${i} of the catalogue, a short line about ${TOPICS[i % 4]} number ${i * 7}.`,
  );
  const inputs = texts.map((t) => ctx.tokenizeSync(t, true));
  const oneByOne = async () => {
    const vectors = [];
    for (const tokens of inputs) {
      await ctx.encode(tokens);
      vectors.push(ctx.getEmbeddings(true));
    }
    return vectors;
  };
  const times = { single: [], batched: [] };
  let worst = 1;
  for (let rep = 0; rep < REPS; rep++) {
    let t0 = performance.now();
    const single = await oneByOne();
    times.single.push(performance.now() - t0);
    t0 = performance.now();
    const batched = await ctx.embedBatch(inputs);
    times.batched.push(performance.now() - t0);
    worst = Math.min(worst, ...batched.map((v, i) => cosine(v, single[i])));
  }
  ctx.dispose();
  const [single, batched] = [median(times.single), median(times.batched)];
  const result = {
    model: 'nomic-embed-text-v1.5 F16',
    texts: TEXTS,
    tokens: inputs.reduce((sum, t) => sum + t.length, 0),
    nSeqMax: SEQS,
    threads: THREADS,
    singleMs: Math.round(single),
    batchedMs: Math.round(batched),
    speedup: Number((single / batched).toFixed(2)),
    worstCosine: worst,
    servers: args.servers ? await servers(modelPath, texts) : null,
  };
  if (args.json) console.log(JSON.stringify(result));
  else
    console.log(
      `${TEXTS} texts (${result.tokens} tokens), nSeqMax ${SEQS}: one encode each ${result.singleMs} ms, ` +
        `embedBatch ${result.batchedMs} ms (${result.speedup}x); worst cosine ${worst.toFixed(7)}` +
        (result.servers
          ? `; servers: ours ${result.servers.oursTextsS.toFixed(1)} texts/s, llama.cpp ` +
            `${result.servers.llamaCppTextsS.toFixed(1)} (${result.servers.ratio.toFixed(2)}x)`
          : ''),
    );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
