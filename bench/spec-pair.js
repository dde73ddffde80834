#!/usr/bin/env node
'use strict';

/**
 * Draft-model speculation on a real pair (issue 60): Qwen2.5-Coder-0.5B-Instruct drafting for
 * -1.5B-Instruct (the same vocabulary), greedy, one stream, measured in one run:
 *   cost      the target's step of 1 + k rows (every row a logits row) against a plain step,
 *             and one draft token on the draft model: what a verified draft token costs here,
 *             and the best speed-up any draft length could give at 90 % acceptance
 *   single    `Branch.generate` on code prompts and a free-text prompt: plain; adaptive drafting
 *             on a fresh step-cost fit ("cold": the first generation on the pair) and on the fit
 *             the earlier generations left ("warm"); a fixed draft of 3 (`adaptive: false`, the
 *             raw cost of drafting); prompt lookup on the code prompts
 *   servers   with --peer: one client, the code prompts through /v1/chat/completions on
 *             `llama-branch serve` (plain, `--spec draft`) and llama.cpp's server from the
 *             pinned xllamacpp wheel (plain, draft_simple with n_max 3), all four up at once,
 *             the prompt cached after a warm-up request, rounds in rotating order
 *
 * Usage: node bench/spec-pair.js [--tokens=160] [--reps=2] [--threads=2] [--peer | --only=servers]
 *        [--target=path.gguf --draft=path.gguf]   (npm run bench:spec-pair -- ...)
 * Writes bench/results/spec-pair-<timestamp>.json and prints the numbers.
 */

const fs = require('node:fs');
const path = require('node:path');
const { createContext, Branch, BranchStore, systemInfo } = require('..');
const { ensureModel } = require('../scripts/fetch-model');
const { args, median, freePort, startProcess, stopProcess, startLlamaCppServer } = require('./common');

const TOKENS = Number(args.tokens || 160);
const REPS = Number(args.reps || 2);
const THREADS = Number(args.threads || 2);
const TARGET = args.target ? path.resolve(String(args.target)) : ensureModel('qwen2.5-coder-1.5b');
const DRAFT = args.draft ? path.resolve(String(args.draft)) : ensureModel('qwen2.5-coder-0.5b');
const log = (...a) => console.error('[bench:spec-pair]', ...a);

const CODE = [
  'Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.',
  'Write a JavaScript debounce(fn, ms) function with JSDoc comments and a usage example.',
];
const FREE = 'Write a short story about a lighthouse keeper who finds a message in a bottle.';
const chat = (text) => [{ role: 'user', content: text }];

async function timed(fn) {
  const t0 = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - t0 };
}

/** ms of the target's step of 1 + k rows, and of one draft-model token. */
async function costs(ctx, draftCtx, prompt) {
  const stepOf = async (c, k) => {
    const store = new BranchStore(c);
    const b = Branch.create(c, 0, { temperature: 0 });
    await b.prefill(prompt);
    const samples = [];
    for (let rep = 0; rep < 8; rep++) {
      const t = b.produce().token;
      const draft = Array.from({ length: k }, (_, i) => 1000 + i);
      samples.push((await timed(() => store.commitDrafts([[b, t, draft]]))).ms);
    }
    await b.prune();
    return median(samples.slice(2));
  };
  const target = {};
  for (const k of [0, 1, 2, 3, 4]) target[k] = await stepOf(ctx, k);
  const draftToken = await stepOf(draftCtx, 0);
  const a = 0.9;
  let best = { k: 0, speedUp: 1 };
  for (const k of [1, 2, 3, 4]) {
    const speedUp = (1 - a ** (k + 1)) / (1 - a) / ((target[k] + k * draftToken) / target[0]);
    if (speedUp > best.speedUp) best = { k, speedUp };
  }
  return { targetStepMs: target, draftTokenMs: draftToken, bestAt90: best };
}

/** One greedy generation of TOKENS on `ctx` from `prompt`. */
async function single(ctx, prompt, speculative) {
  const b = Branch.create(ctx, 0, { temperature: 0 });
  await b.prefill(prompt);
  const { value: r, ms } = await timed(() => b.generate({ maxTokens: TOKENS, history: prompt, speculative }));
  await b.prune();
  return { tokS: (r.tokens.length / ms) * 1000, ms, tokens: r.tokens, ...r.speculative };
}

/** Every single-stream series, REPS times, interleaved; the cold fit gets a fresh draft context. */
async function singles(ctx, draftCtx) {
  const code = await Promise.all(CODE.map((t) => ctx.tokenize(ctx.formatChatSync(chat(t)).prompt)));
  const free = await ctx.tokenize(ctx.formatChatSync(chat(FREE)).prompt);
  const names = [
    'codePlain',
    'codeDraftCold',
    'codeDraftFixed3',
    'codeDraftWarm',
    'codeLookup',
    'freePlain',
    'freeDraftWarm',
  ];
  const runs = Object.fromEntries(names.map((n) => [n, []]));
  let identical = true;
  for (let rep = 0; rep < REPS; rep++) {
    for (const prompt of code) {
      const plain = await single(ctx, prompt);
      const coldCtx = await createContext({ modelPath: DRAFT, nCtx: 4096, nThreads: THREADS, nSeqMax: 4 });
      const cold = await single(ctx, prompt, { draft: coldCtx, maxDraft: 4 });
      coldCtx.dispose();
      const fixed = await single(ctx, prompt, { draft: draftCtx, maxDraft: 3, adaptive: false });
      const warm = await single(ctx, prompt, { draft: draftCtx, maxDraft: 4 });
      const lookup = await single(ctx, prompt, { lookup: true, maxDraft: 8 });
      identical &&= [cold, fixed, warm, lookup].every((r) => r.tokens.join() === plain.tokens.join());
      [plain, cold, fixed, warm, lookup].forEach((r, i) => runs[names[i]].push(r));
    }
    runs.freePlain.push(await single(ctx, free));
    runs.freeDraftWarm.push(await single(ctx, free, { draft: draftCtx, maxDraft: 4 }));
    log(`rep ${rep + 1}/${REPS}:`, names.map((n) => `${n} ${runs[n].at(-1).tokS.toFixed(1)}`).join(', '));
  }
  const series = Object.fromEntries(
    Object.entries(runs).map(([n, rs]) => [
      n,
      {
        tokS: median(rs.map((r) => r.tokS)),
        drafted: rs.reduce((s, r) => s + r.drafted, 0),
        accepted: rs.reduce((s, r) => s + r.accepted, 0),
        steps: rs.reduce((s, r) => s + r.steps, 0),
        tokens: rs.reduce((s, r) => s + r.tokens.length, 0),
      },
    ]),
  );
  return { series, sameTokensAsPlain: identical };
}

async function startServer(kind, withDraft) {
  const port = await freePort();
  if (kind === 'xllamacpp')
    return startLlamaCppServer({ model: TARGET, threads: THREADS, port, draft: withDraft ? DRAFT : null });
  const bin = path.join(__dirname, '..', 'bin', 'llama-branch.js');
  const argv = [bin, 'serve', '--model', TARGET, '--port', String(port), '--threads', String(THREADS)];
  argv.push('--ctx-size', '4096', '--parallel', '1', '--no-ui');
  if (withDraft) argv.push('--spec', 'draft', '--model-draft', DRAFT, '--spec-max-draft', '4');
  return startProcess(process.execPath, argv, port);
}

/** One chat completion of `text` to `url`: completion tokens per second. */
async function rate(url, text) {
  const body = { messages: chat(text), max_tokens: TOKENS, temperature: 0 };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status} ${await res.text()}`);
  const value = await res.json();
  return (value.usage.completion_tokens / (performance.now() - t0)) * 1000;
}

/**
 * The four servers up at once; each code prompt sent once to each as a warm-up (the prompt is
 * cached from then on), then REPS rounds, the servers in a rotating order per round, so that
 * the machine's load changes hit all four alike.
 */
async function servers() {
  const kinds = [
    ['oursPlain', 'ours', false],
    ['oursDraft', 'ours', true],
    ['llamaCppPlain', 'xllamacpp', false],
    ['llamaCppDraft', 'xllamacpp', true],
  ];
  const up = {};
  try {
    for (const [name, kind, withDraft] of kinds) up[name] = await startServer(kind, withDraft);
    const names = Object.keys(up);
    for (const name of names) for (const text of CODE) await rate(up[name].url, text);
    const rates = Object.fromEntries(names.map((n) => [n, []]));
    for (let rep = 0; rep < REPS; rep++) {
      const order = names.map((_, i) => names[(i + rep) % names.length]);
      for (const name of order) for (const text of CODE) rates[name].push(await rate(up[name].url, text));
      log(`servers round ${rep + 1}/${REPS}:`, order.map((n) => `${n} ${rates[n].at(-1).toFixed(1)}`).join(', '));
    }
    return Object.fromEntries(names.map((n) => [n, { tokS: median(rates[n]), rates: rates[n] }]));
  } finally {
    for (const s of Object.values(up)) await stopProcess(s.child);
  }
}

/** The server comparison alone (`--only=servers`). */
async function serversOnly() {
  const peer = await servers();
  const ratios = {
    oursDraftVsPlain: peer.oursDraft.tokS / peer.oursPlain.tokS,
    llamaCppDraftVsPlain: peer.llamaCppDraft.tokS / peer.llamaCppPlain.tokS,
    oursDraftVsLlamaCppDraft: peer.oursDraft.tokS / peer.llamaCppDraft.tokS,
    oursPlainVsLlamaCppPlain: peer.oursPlain.tokS / peer.llamaCppPlain.tokS,
  };
  console.log(
    JSON.stringify({ date: new Date().toISOString(), tokens: TOKENS, reps: REPS, servers: peer, ratios }, null, 2),
  );
}

async function main() {
  if (args.only === 'servers') return serversOnly();
  const ctx = await createContext({ modelPath: TARGET, nCtx: 4096, nThreads: THREADS, nSeqMax: 4, nOutputs: 16 });
  const draftCtx = await createContext({ modelPath: DRAFT, nCtx: 4096, nThreads: THREADS, nSeqMax: 4 });
  const prompt = await ctx.tokenize(ctx.formatChatSync(chat(CODE[0])).prompt);
  const cost = await costs(ctx, draftCtx, prompt);
  log('costs:', JSON.stringify(cost));
  const { series: s, sameTokensAsPlain } = await singles(ctx, draftCtx);
  draftCtx.dispose();
  ctx.dispose();
  const peer = args.peer ? await servers() : null;
  const result = {
    date: new Date().toISOString(),
    system: systemInfo(),
    target: path.basename(TARGET),
    draft: path.basename(DRAFT),
    threads: THREADS,
    reps: REPS,
    tokens: TOKENS,
    cost,
    series: s,
    sameTokensAsPlain,
    ratios: {
      codeDraftCold: s.codeDraftCold.tokS / s.codePlain.tokS,
      codeDraftWarm: s.codeDraftWarm.tokS / s.codePlain.tokS,
      codeDraftFixed3: s.codeDraftFixed3.tokS / s.codePlain.tokS,
      codeLookup: s.codeLookup.tokS / s.codePlain.tokS,
      freeDraftWarm: s.freeDraftWarm.tokS / s.freePlain.tokS,
      ...(peer
        ? {
            oursDraftVsPlain: peer.oursDraft.tokS / peer.oursPlain.tokS,
            llamaCppDraftVsPlain: peer.llamaCppDraft.tokS / peer.llamaCppPlain.tokS,
            oursDraftVsLlamaCppDraft: peer.oursDraft.tokS / peer.llamaCppDraft.tokS,
            oursPlainVsLlamaCppPlain: peer.oursPlain.tokS / peer.llamaCppPlain.tokS,
          }
        : {}),
    },
    servers: peer,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `spec-pair-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, JSON.stringify(result, null, 2));
  console.log(JSON.stringify({ cost, ratios: result.ratios, sameTokensAsPlain }, null, 2));
  log(`wrote ${path.relative(process.cwd(), file)}`);
}

module.exports = { main };
if (require.main === module) main().catch((e) => (console.error(e), process.exit(1)));
