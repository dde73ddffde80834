#!/usr/bin/env node
'use strict';

/**
 * Speculative-decoding benchmark (issue 25), measured in one run so machine noise hits every
 * series alike (series interleaved, medians of --reps):
 *   row cost    one verification decode of 1 + k rows (every row a logits row) against a plain
 *               1-row step: what a draft token costs on this machine, which decides the gain
 *   single      one stream, greedy, 256 new tokens, `Branch.generate` plain vs prompt lookup
 *               (and a draft model: the same model as its own draft, a test of the machinery,
 *               not a speed-up) on (a) a copy-heavy task — rewrite a given ~400-token text with
 *               small edits — and (b) free generation
 *   scheduler   C = 4 concurrent requests of task (a) through the Scheduler, plain vs lookup
 * Reports tokens/s, the acceptance rate and tokens per decode.
 *   servers     with --peer=<llama-server binary>: one client, task (a) through /v1/completions,
 *               llama.cpp's server with and without its n-gram speculation (`--spec-type
 *               ngram-simple`) against `llama-branch serve` with and without `--spec lookup`,
 *               same model, same threads, the prompt cached after a warm-up request
 *
 * Usage: node bench/spec.js [--reps=3] [--tokens=256] [--peer=path/to/llama-server] [--only=servers|rowcost]
 *        (or npm run bench -- --spec ...)
 * Writes bench/results/spec-<timestamp>.json and prints the numbers.
 */

const fs = require('node:fs');
const path = require('node:path');
const { createContext, Branch, BranchStore, Scheduler, systemInfo } = require('..');
const { args, modelPath, median, startProcess, stopProcess } = require('./common');

const REPS = Number(args.reps || 3);
const TOKENS = Number(args.tokens || 256);
const THREADS = Number(args.threads || 2);
const C = 4;
const log = (...a) => console.error('[bench:spec]', ...a);

/** ~400 tokens to copy with edits. */
const TEXT = `The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great lens until it shone. Ships passing in the dark relied on its steady beam to avoid the rocks below. In the winter storms the waves rose so high that spray reached the lantern room, and the keeper would watch the horizon for hours, counting the seconds between flashes.

When the lighthouse was finally automated, the last keeper packed his few belongings, locked the door behind him and walked down the long road to the village, where he lived quietly until the end of his days. People say that on clear nights you can still see a figure at the top of the tower, looking out to sea.

The village itself changed slowly. The harbour was dredged, the fish market moved indoors, and a small museum opened in the old customs house. Visitors came in summer to walk the coastal path, buy smoked fish from the stalls by the quay and climb the hill to photograph the tower at sunset. In winter the streets emptied again, the cafés closed their shutters, and only the wind and the gulls kept the fishermen company as they mended their nets on the sea wall.`;
const COPY = `Original text:\n${TEXT}\n\nCorrected copy (British spelling, typos fixed, otherwise identical):\nThe old lighthouse stood at the edge of the cliff for`;
const FREE = 'Write a short essay about the history of bread, from the first flatbreads to modern bakeries.\n\n';

async function timed(fn) {
  const started = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - started };
}

/** ms per verification step of 1 + k rows (drafts of wrong tokens: every step rejects). */
async function rowCost(ctx, prompt, ks) {
  const store = new BranchStore(ctx);
  const b = Branch.create(ctx, 0, { temperature: 0 });
  await b.prefill(prompt);
  const out = {};
  for (const k of ks) {
    const samples = [];
    for (let rep = 0; rep < 12; rep++) {
      const t = b.produce().token;
      const draft = Array.from({ length: k }, (_, i) => 1000 + i);
      samples.push((await timed(() => store.commitDrafts([[b, t, draft]]))).ms);
    }
    out[k] = median(samples.slice(2));
  }
  await b.prune();
  return out;
}

/** One greedy stream through Branch.generate. */
async function single(ctx, prompt, speculative) {
  const b = Branch.create(ctx, 0, { temperature: 0 });
  await b.prefill(prompt);
  const { value: r, ms } = await timed(() => b.generate({ maxTokens: TOKENS, history: prompt, speculative }));
  await b.prune();
  return { tokS: (r.tokens.length / ms) * 1000, tokens: r.tokens.length, ...r.speculative };
}

/** C concurrent copies of task (a) through a Scheduler (prompts prefilled before timing). */
async function scheduled(ctx, speculative) {
  const scheduler = new Scheduler(ctx, speculative ? { speculative } : {});
  const prompts = Array.from({ length: C }, (_, i) => `Copy ${i + 1}.\n${COPY}`);
  // Warm the prefix cache with each prompt so the timed part is decoding.
  await Promise.all(prompts.map((prompt) => scheduler.generate({ prompt, maxTokens: 1 })));
  const { value: results, ms } = await timed(() =>
    Promise.all(prompts.map((prompt) => scheduler.generate({ prompt, maxTokens: TOKENS, params: { temperature: 0 } }))),
  );
  const stats = scheduler.stats();
  await scheduler.close();
  const tokens = results.reduce((sum, r) => sum + r.choices[0].tokens.length, 0);
  return { tokS: (tokens / ms) * 1000, tokens, drafted: stats.draftTokens, accepted: stats.acceptedDraftTokens };
}

/** tok/s of one client sending task (a) `REPS` times (after one warm-up) to `url`. */
async function clientRate(url) {
  const body = JSON.stringify({ prompt: COPY, max_tokens: TOKENS, temperature: 0 });
  const send = async () => {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    return res.json();
  };
  await send(); // warm-up: the prompt is cached from here on in both servers
  const rates = [];
  let details = null;
  for (let rep = 0; rep < REPS; rep++) {
    const { value: r, ms } = await timed(send);
    rates.push((r.usage.completion_tokens / ms) * 1000);
    details = r.usage.completion_tokens_details || details;
  }
  return { tokS: median(rates), details };
}

/** llama.cpp's server (its n-gram speculation on and off) against ours (lookup on and off). */
async function servers(model, peer) {
  const bin = path.join(__dirname, '..', 'bin', 'llama-branch.js');
  const out = {};
  const peerArgs = (port, extra) => [
    ...['-m', model, '--host', '127.0.0.1', '--port', String(port), '-t', String(THREADS), '-c', '4096', '-np', '1'],
    ...extra,
  ];
  const ourArgs = (port, extra) => [
    ...[bin, 'serve', '--model', model, '--port', String(port), '--threads', String(THREADS)],
    ...['--ctx-size', '4096', '--parallel', '1', ...extra],
  ];
  const ngram = ['--spec-type', 'ngram-simple', '--spec-ngram-simple-size-n', '3', '--spec-ngram-simple-size-m', '16'];
  const configs = [
    ['llamaCppPlain', peer, (port) => peerArgs(port, ['--spec-type', 'none'])],
    ['llamaCppNgram', peer, (port) => peerArgs(port, ngram)],
    ['oursPlain', process.execPath, (port) => ourArgs(port, ['--spec', 'none'])],
    ['oursLookup', process.execPath, (port) => ourArgs(port, ['--spec', 'lookup', '--spec-max-draft', '16'])],
  ];
  let port = 18600;
  for (const [name, cmd, argv] of configs) {
    port++;
    const server = await startProcess(cmd, argv(port), port);
    try {
      out[name] = await clientRate(server.url);
      log(`${name}: ${out[name].tokS.toFixed(1)} tok/s`, JSON.stringify(out[name].details || {}));
    } finally {
      await stopProcess(server.child);
    }
  }
  return out;
}

function summary(runs) {
  const m = (key) => median(runs.map((r) => r[key]));
  return {
    tokS: m('tokS'),
    tokens: m('tokens'),
    acceptance: runs[0].drafted ? m('accepted') / m('drafted') : null,
    tokensPerDecode: runs[0].steps ? m('tokens') / m('steps') : null,
    drafted: m('drafted'),
    accepted: m('accepted'),
  };
}

async function main() {
  const model = modelPath();
  if (args.only === 'servers') {
    if (!args.peer) throw new Error('--only=servers needs --peer=<llama-server binary>');
    const peer = await servers(model, String(args.peer));
    console.log(
      JSON.stringify(
        { date: new Date().toISOString(), threads: THREADS, reps: REPS, tokens: TOKENS, servers: peer },
        null,
        2,
      ),
    );
    return;
  }
  const ctx = await createContext({ modelPath: model, nCtx: 8192, nThreads: THREADS, nSeqMax: 16, nOutputs: 48 });
  if (args.only === 'rowcost') {
    // The row-cost table alone (a minute), e.g. to check a statement about it in the docs.
    const costs = await rowCost(ctx, await ctx.tokenize(COPY), [0, 1, 2, 4, 8, 16]);
    const ratio = Object.fromEntries(Object.entries(costs).map(([k, ms]) => [k, ms / costs[0]]));
    const perRow = Object.fromEntries(Object.entries(ratio).map(([k, x]) => [k, k === '0' ? 0 : (x - 1) / Number(k)]));
    console.log(JSON.stringify({ date: new Date().toISOString(), threads: THREADS, rowCostMs: costs, ratio, perRow }));
    ctx.dispose();
    return;
  }
  const draftCtx = await createContext({ modelPath: model, nCtx: 4096, nThreads: THREADS, nSeqMax: 4 });
  const copy = await ctx.tokenize(COPY);
  const free = await ctx.tokenize(FREE);
  log(`copy prompt ${copy.length} tokens, free prompt ${free.length}; ${REPS} reps, ${TOKENS} tokens`);

  const costs = await rowCost(ctx, copy, [0, 1, 2, 4, 8, 16]);
  log('row cost (ms per step of 1 + k rows):', JSON.stringify(costs));

  const series = {
    copyPlain: [],
    copyLookup: [],
    copyDraft: [],
    freePlain: [],
    freeLookup: [],
    schedPlain: [],
    schedLookup: [],
  };
  for (let rep = 0; rep < REPS; rep++) {
    series.copyPlain.push(await single(ctx, copy, undefined));
    series.copyLookup.push(await single(ctx, copy, { lookup: true, maxDraft: 16 }));
    series.freePlain.push(await single(ctx, free, undefined));
    series.freeLookup.push(await single(ctx, free, { lookup: true, maxDraft: 16 }));
    series.schedPlain.push(await scheduled(ctx, undefined));
    series.schedLookup.push(await scheduled(ctx, { lookup: true, maxDraft: 8 }));
    if (rep === 0) series.copyDraft.push(await single(ctx, copy, { draft: draftCtx, maxDraft: 4 }));
    log(
      `rep ${rep + 1}/${REPS}:`,
      JSON.stringify(
        Object.fromEntries(Object.entries(series).map(([k, v]) => [k, Math.round(v[v.length - 1].tokS * 10) / 10])),
      ),
    );
  }
  const s = Object.fromEntries(Object.entries(series).map(([k, v]) => [k, summary(v)]));
  draftCtx.dispose();
  ctx.dispose();
  const peer = args.peer ? await servers(model, String(args.peer)) : null;
  const result = {
    date: new Date().toISOString(),
    system: systemInfo(),
    model: path.basename(model),
    threads: THREADS,
    reps: REPS,
    tokens: TOKENS,
    rowCostMs: costs,
    rowCostRatio: Object.fromEntries(Object.entries(costs).map(([k, ms]) => [k, ms / costs[0]])),
    series: s,
    ratios: {
      copyLookup: s.copyLookup.tokS / s.copyPlain.tokS,
      copyDraft: s.copyDraft.tokS / s.copyPlain.tokS,
      freeLookup: s.freeLookup.tokS / s.freePlain.tokS,
      schedulerLookupC4: s.schedLookup.tokS / s.schedPlain.tokS,
      ...(peer
        ? {
            llamaCppNgram: peer.llamaCppNgram.tokS / peer.llamaCppPlain.tokS,
            oursLookupServer: peer.oursLookup.tokS / peer.oursPlain.tokS,
            oursLookupVsLlamaCppNgram: peer.oursLookup.tokS / peer.llamaCppNgram.tokS,
          }
        : {}),
    },
    servers: peer,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `spec-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, JSON.stringify(result, null, 2));
  console.log(JSON.stringify(result, null, 2));
  log(`wrote ${path.relative(process.cwd(), file)}`);
}

module.exports = { main };
if (require.main === module) main().catch((e) => (console.error(e), process.exit(1)));
