#!/usr/bin/env node
'use strict';

/**
 * Batched embeddings (`npm run bench:embeddings`, issue 60), in one run on one context of
 * nomic-embed-text-v1.5 (fetched by name): `--texts` short documents embedded one `encode` each
 * against one `embedBatch` (as many per decode as the context has sequences, `--seqs`),
 * interleaved `--reps` times (medians), and the worst cosine between the two ways' vectors.
 *
 * Flags: --texts=64 --seqs=8 --reps=3 --threads=2 --json
 */

const { createContext } = require('..');
const { ensureModel } = require('../scripts/fetch-model');
const { args, median } = require('./common');

const TEXTS = Number(args.texts || 64);
const SEQS = Number(args.seqs || 8);
const REPS = Number(args.reps || 3);
const THREADS = Number(args.threads || 2);
const TOPICS = ['rivers', 'clocks', 'mosses', 'ledgers'];

const cosine = (a, b) => a.reduce((sum, x, i) => sum + x * b[i], 0);

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
  };
  if (args.json) console.log(JSON.stringify(result));
  else
    console.log(
      `${TEXTS} texts (${result.tokens} tokens), nSeqMax ${SEQS}: one encode each ${result.singleMs} ms, ` +
        `embedBatch ${result.batchedMs} ms (${result.speedup}x); worst cosine ${worst.toFixed(7)}`,
    );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
