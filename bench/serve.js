#!/usr/bin/env node
'use strict';

/**
 * Serving benchmark (issue 14): C = 1, 4, 8, 16 concurrent clients, each with the same ~256-token
 * system prompt plus its own ~32-token question, 64 new tokens each, greedy (end-of-generation
 * tokens banned so every run generates exactly 64). Measured in one run, three ways:
 *   scheduler   the C requests submitted at once to a Scheduler with a cold cache
 *   loop        the same work written by hand: prefill the system prompt once, fork C times,
 *               one store.prefill of the C questions, then store.produce + ONE store.commit per step
 *   sequential  the same C requests through a Scheduler one after another
 * plus time to first token of a lone request with a cold vs a cached system prompt, and the
 * decode step time at C = 16 against the total KV cells (16 unrelated prompts of 64..1000 tokens).
 *
 * Usage: node bench/serve.js [--c=1,4,8,16] [--reps=2] [--threads=2] [--parts=concurrency,ttft,cells] [--deterministic]
 *        (or npm run bench -- --serve ...)
 * (--threads=1 on an oversubscribed machine: llama.cpp's spinning thread barriers degrade badly
 * when its threads lose their cores.)
 * Writes bench/results/serve-<timestamp>.json and prints the tables.
 */

const fs = require('node:fs');
const path = require('node:path');
const { createContext, Branch, BranchStore, Scheduler, systemInfo } = require('..');
const { args, modelPath, median, percentile } = require('./common');

const CS = args.c ? String(args.c).split(',').map(Number) : [1, 4, 8, 16];
const REPS = Number(args.reps || 2);
const NEW_TOKENS = 64;
const THREADS = Number(args.threads || 2);
const CELL_PROMPTS = [64, 256, 512, 1000];
const PARTS = new Set(String(args.parts || 'concurrency,ttft,cells').split(','));
/** `--deterministic`: a deterministic context (issue 51's cost at C clients: run with and without). */
const DETERMINISTIC = args.deterministic !== undefined && args.deterministic !== 'false';
const MODEL = modelPath();

const now = () => performance.now();
const log = (...a) => console.error('[bench:serve]', ...a);

const SYSTEM_SENTENCES = [
  'You are the support assistant of a small public library in a coastal town.',
  'You answer questions about opening hours, membership, borrowing rules, events and the local history collection.',
  'Members may borrow up to twelve items at once for three weeks, and renew each item twice unless another member reserved it.',
  'Late returns cost ten cents per item per day, capped at the price of the item, and children never pay late fees.',
  'The library opens at nine on weekdays and at ten on Saturdays, closes at six, and stays closed on Sundays and public holidays.',
  'The reading room on the first floor is a quiet zone, while the ground floor has group tables, a café corner and public computers.',
  'Printing costs fifteen cents per page in black and white and fifty cents in colour; scanning is free.',
  'The local history collection holds maps, photographs, ship registers and newspapers from 1850 onwards, and may only be read on site.',
  'Every first Thursday of the month there is an evening talk, and every Saturday morning a reading hour for children under eight.',
  'Answer politely and briefly, in plain words, and if you do not know something, say so and suggest asking the front desk.',
];

/** ~256 tokens of system prompt and C different ~32-token questions. */
function workload(ctx, c) {
  const system = SYSTEM_SENTENCES.join(' ');
  const questions = Array.from(
    { length: c },
    (_, i) =>
      `Question number ${i + 1}: I am a new member and would like to know, in a few clear sentences, how the rules for item ${i + 1} of my list apply to me.`,
  );
  return {
    system,
    questions,
    messages: questions.map((q) => [
      { role: 'system', content: system },
      { role: 'user', content: q },
    ]),
  };
}

/** Greedy with every end-of-generation token banned: each request makes exactly NEW_TOKENS. */
function greedyParams(ctx) {
  const stops = new Set([ctx.getEogToken(), ...ctx.getTurnSeparator().filter((t) => ctx.isStopToken(t))]);
  for (const t of ctx.tokenizeSync('<eos>', false)) if (ctx.isStopToken(t)) stops.add(t);
  return { temperature: 0, logitBias: [...stops].map((token) => ({ token, bias: -Infinity })) };
}

/** C requests at once through a fresh Scheduler (cold cache). */
async function viaScheduler(ctx, messages, params) {
  const scheduler = new Scheduler(ctx, { maxQueue: 256 });
  const t0 = now();
  const ttft = [];
  let tokens = 0;
  let cached = 0;
  await Promise.all(
    messages.map(async (m) => {
      const gen = scheduler.generate({ messages: m, maxTokens: NEW_TOKENS, params });
      let waiting = true;
      for await (const e of gen) {
        if (waiting && e.token !== null) {
          ttft.push(now() - t0);
          waiting = false;
        }
      }
      const r = await gen;
      tokens += r.usage.completionTokens;
      cached += r.usage.cachedPromptTokens;
    }),
  );
  const ms = now() - t0;
  await scheduler.close();
  return {
    ms,
    tokens,
    tps: (tokens / ms) * 1000,
    ttftP50: percentile(ttft, 50),
    ttftP95: percentile(ttft, 95),
    cached,
  };
}

/** The same C requests, one after another, through one Scheduler. */
async function sequential(ctx, messages, params) {
  const scheduler = new Scheduler(ctx);
  const t0 = now();
  let tokens = 0;
  for (const m of messages)
    tokens += (await scheduler.generate({ messages: m, maxTokens: NEW_TOKENS, params })).usage.completionTokens;
  const ms = now() - t0;
  await scheduler.close();
  return { ms, tokens, tps: (tokens / ms) * 1000 };
}

/** The hand-written loop over the same tokens: the ceiling the Scheduler is measured against. */
async function explicitLoop(ctx, messages, params) {
  const store = new BranchStore(ctx);
  const prompts = [];
  for (const m of messages) prompts.push(ctx.tokenizeSync((await ctx.formatChat(m)).prompt, true));
  let shared = 0;
  while (prompts.every((p) => p[shared] === prompts[0][shared]) && shared < prompts[0].length - 1) shared++;
  if (messages.length === 1) shared = prompts[0].length - 32;
  const t0 = now();
  const root = Branch.create(ctx, 0, params);
  await root.prefill(prompts[0].slice(0, shared));
  const branches = prompts.map(() => root.fork());
  await store.prefill(branches.map((b, i) => [b, prompts[i].slice(shared)]));
  for (let step = 0; step < NEW_TOKENS - 1; step++) {
    const produced = store.produce(branches);
    await store.commit(branches.map((b, i) => [b, produced[i].token]));
  }
  store.produce(branches); // the 64th token is sampled, not decoded (as the Scheduler does)
  const ms = now() - t0;
  await root.pruneSubtree();
  const tokens = branches.length * NEW_TOKENS;
  return { ms, tokens, tps: (tokens / ms) * 1000 };
}

/** Time to first token of one lone request: cold (nothing cached), then with its system prompt cached. */
async function ttftColdVsCached(ctx, params) {
  const { messages } = workload(ctx, 2);
  const cold = [];
  const warm = [];
  for (let r = 0; r < 3; r++) {
    const scheduler = new Scheduler(ctx);
    const first = async (m) => {
      const t0 = now();
      const gen = scheduler.generate({ messages: m, maxTokens: 2, params });
      for await (const e of gen) if (e.token !== null) break;
      const ms = now() - t0;
      const { usage } = await gen;
      return { ms, usage };
    };
    const c = await first(messages[0]);
    const w = await first(messages[1]);
    cold.push(c.ms);
    warm.push(w.ms);
    if (r === 0) log(`cold usage ${JSON.stringify(c.usage)}, cached usage ${JSON.stringify(w.usage)}`);
    await scheduler.close();
  }
  return { coldMs: median(cold), cachedMs: median(warm), ratio: median(warm) / median(cold) };
}

/** Decode step time at C = 16 against total KV cells: 16 unrelated prompts of each length. */
async function stepTimeVsCells(ctx, params) {
  const rows = [];
  const filler =
    'Notes on the tides, the weather and the ships that came into the harbour during the long summer of that year. ';
  for (const length of CELL_PROMPTS) {
    const steps = [];
    const scheduler = new Scheduler(ctx, { prefillChunk: 512, onStep: (s) => steps.push(s) });
    const prompts = Array.from({ length: 16 }, (_, i) => {
      const tokens = ctx.tokenizeSync(`Log ${i + 1}. ${filler.repeat(Math.ceil(length / 20))}`, true);
      return tokens.slice(0, length);
    });
    // long enough that the last prompt is prefilled while the first is still generating, so
    // that 16 rows decode together for at least 16 steps
    const maxTokens = Math.ceil((16 * length) / 512) + 16;
    await Promise.all(prompts.map((tokens) => scheduler.generate({ tokens, maxTokens, params })));
    await scheduler.close();
    const full = steps.filter((s) => s.rows === 16 && s.prefillTokens === 0);
    rows.push({
      promptTokens: length,
      cells: median(full.map((s) => s.cellsUsed)),
      stepMs: median(full.map((s) => s.decodeMs)),
      steps: full.length,
    });
    log(`cells ${rows[rows.length - 1].cells}: ${rows[rows.length - 1].stepMs.toFixed(1)} ms/step`);
  }
  return rows;
}

async function main() {
  const started = now();
  const ctx = await createContext({
    modelPath: MODEL,
    nCtx: 18432,
    nSeqMax: 64,
    nThreads: THREADS,
    deterministic: DETERMINISTIC,
  });
  const params = greedyParams(ctx);
  const { messages: warmup } = workload(ctx, 2);
  await viaScheduler(ctx, warmup, params);

  const concurrency = [];
  for (const c of PARTS.has('concurrency') ? CS : []) {
    const { messages } = workload(ctx, c);
    const reps = [];
    for (let r = 0; r < REPS; r++) {
      // rotate the order so that load changes hit the three alike
      const runs = {};
      const order = [
        ['scheduler', viaScheduler],
        ['loop', explicitLoop],
        ['sequential', sequential],
      ];
      for (let k = 0; k < order.length; k++) {
        const [name, fn] = order[(k + r) % order.length];
        runs[name] = await fn(ctx, messages, params);
      }
      reps.push(runs);
    }
    const pick = (name, key) => median(reps.map((x) => x[name][key]));
    const row = {
      c,
      schedulerTps: pick('scheduler', 'tps'),
      loopTps: pick('loop', 'tps'),
      sequentialTps: pick('sequential', 'tps'),
      ttftP50: pick('scheduler', 'ttftP50'),
      ttftP95: pick('scheduler', 'ttftP95'),
      cachedPromptTokens: pick('scheduler', 'cached'),
    };
    row.vsLoop = row.schedulerTps / row.loopTps;
    row.vsSequential = row.schedulerTps / row.sequentialTps;
    concurrency.push(row);
    log(`C=${c}: ${JSON.stringify(row)}`);
  }
  const ttft = PARTS.has('ttft') ? await ttftColdVsCached(ctx, params) : null;
  if (ttft) log(`TTFT cold ${ttft.coldMs.toFixed(0)} ms, cached ${ttft.cachedMs.toFixed(0)} ms`);
  const cells = PARTS.has('cells') ? await stepTimeVsCells(ctx, params) : [];
  ctx.dispose();

  const result = {
    date: new Date().toISOString(),
    system: systemInfo(),
    threads: THREADS,
    deterministic: DETERMINISTIC,
    newTokens: NEW_TOKENS,
    reps: REPS,
    concurrency,
    ttft,
    cells,
    wallSeconds: (now() - started) / 1000,
  };
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `serve-${result.date.replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);

  console.log(
    '|  C | scheduler tok/s | loop tok/s | sequential tok/s | sched / loop | sched / seq | TTFT p50 ms | TTFT p95 ms | cached prompt tokens |',
  );
  console.log(
    '|---:|----------------:|-----------:|-----------------:|-------------:|------------:|------------:|------------:|---------------------:|',
  );
  for (const r of concurrency) {
    console.log(
      `| ${String(r.c).padStart(2)} | ${r.schedulerTps.toFixed(1)} | ${r.loopTps.toFixed(1)} | ${r.sequentialTps.toFixed(1)} | ${r.vsLoop.toFixed(2)} | ${r.vsSequential.toFixed(2)} | ${r.ttftP50.toFixed(0)} | ${r.ttftP95.toFixed(0)} | ${r.cachedPromptTokens} |`,
    );
  }
  if (ttft)
    console.log(
      `\nTTFT of a lone request: cold ${ttft.coldMs.toFixed(0)} ms, system prompt cached ${ttft.cachedMs.toFixed(0)} ms (ratio ${ttft.ratio.toFixed(2)})`,
    );
  console.log('\n| prompt tokens × 16 | KV cells in use | decode ms/step (16 rows) |');
  console.log('|---:|---:|---:|');
  for (const r of cells) console.log(`| ${r.promptTokens} | ${r.cells} | ${r.stepMs.toFixed(1)} |`);
  console.log(`\nwrote ${path.relative(process.cwd(), file)} in ${result.wallSeconds.toFixed(0)} s`);
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { main, workload, greedyParams };
