#!/usr/bin/env node
'use strict';

/**
 * Fork admission by the step's time budget (issue 61), in one run on the default model: 4
 * streaming chat requests beside 2 programs that each fork 16 lines, through one Scheduler,
 * with and without `stepBudgetMs` (alternating, `--reps` times). Reported per setting: the
 * chat requests' p50 / p95 time between streamed events, their tokens/s, and the programs'
 * tokens/s (all forks' tokens over the time the two programs took).
 *
 * Usage: node bench/step-budget.js [--budget=<ms>] [--reps=2] [--tokens=96] [--fork-tokens=48]
 *        (npm run bench:step-budget -- ...). Without --budget: 1.5 × a measured 4-row step.
 */

const { createContext, Scheduler } = require('..');
const { args, modelPath, median, percentile } = require('./common');

const REPS = Number(args.reps || 2);
const TOKENS = Number(args.tokens || 96);
const FORK_TOKENS = Number(args['fork-tokens'] || 48);
const FORKS = 16;
const log = (...a) => console.error('[bench:step-budget]', ...a);

const CHATS = [
  'Explain how a bicycle gear works.',
  'Write a short poem about autumn rain.',
  'Give three tips for learning to cook.',
  'Describe the water cycle for a child.',
];

/** One streamed chat request: the gaps between its events (ms) and its tokens. */
async function chat(scheduler, text) {
  const gen = scheduler.generate({ messages: [{ role: 'user', content: text }], maxTokens: TOKENS });
  const gaps = [];
  let last = null;
  for await (const event of gen) {
    void event;
    const now = performance.now();
    if (last !== null) gaps.push(now - last);
    last = now;
  }
  const result = await gen;
  return { gaps, tokens: result.choices[0].tokens.length };
}

/** A program: a prompt, then 16 forks each generating FORK_TOKENS sampled tokens. */
function program(scheduler, seed) {
  return scheduler.run(
    async (root) => {
      root.append(`Story ${seed}: once upon a time`);
      await root.gen({ maxTokens: 4 });
      const forks = root.fork(FORKS);
      const outs = await Promise.all(forks.map((f) => f.gen({ maxTokens: FORK_TOKENS, params: { temperature: 0.9 } })));
      return outs.reduce((sum, o) => sum + o.tokens.length, 0);
    },
    { maxBranches: FORKS + 1, seed },
  );
}

async function sitting(ctx, stepBudgetMs) {
  // The steps' own times while the chats stream (a gap is a step plus what runs between steps).
  const steps = [];
  let chatting = false;
  const onStep = (/** @type {any} */ s) => chatting && steps.push(s);
  const scheduler = new Scheduler(ctx, { stepBudgetMs, maxRunning: 8, onStep });
  await scheduler.generate({ prompt: 'Warm-up:', maxTokens: 8 }); // the fit sees steps first
  chatting = true;
  const t0 = performance.now();
  const programs = Promise.all([program(scheduler, 1), program(scheduler, 2)]).then((tokens) => ({
    tokens: tokens[0] + tokens[1],
    ms: performance.now() - t0,
  }));
  const chats = await Promise.all(CHATS.map((text) => chat(scheduler, text)));
  const chatsMs = performance.now() - t0;
  chatting = false;
  const p = await programs;
  await scheduler.close();
  const gaps = chats.flatMap((c) => c.gaps);
  return {
    chatGapP50: median(gaps),
    chatGapP95: percentile(gaps, 95),
    stepP50: median(steps.map((x) => x.stepMs)),
    stepP95: percentile(
      steps.map((x) => x.stepMs),
      95,
    ),
    rowsP50: median(steps.map((x) => x.rows)),
    chatTokS: (chats.reduce((s, c) => s + c.tokens, 0) / chatsMs) * 1000,
    programTokS: (p.tokens / p.ms) * 1000,
  };
}

/** ms of a decode step of 4 rows on this machine (4 requests of one token each, after warm-up). */
async function fourRowStep(ctx) {
  const times = [];
  const scheduler = new Scheduler(ctx, { onStep: (s) => s.rows === 4 && times.push(s.decodeMs) });
  await Promise.all(CHATS.map((text) => scheduler.generate({ prompt: text, maxTokens: 24 })));
  await scheduler.close();
  return median(times);
}

async function main() {
  const ctx = await createContext({ modelPath: modelPath(), nCtx: 8192, nSeqMax: 48, nThreads: 2 });
  const budget = args.budget ? Number(args.budget) : Math.round(1.5 * (await fourRowStep(ctx)));
  log(`budget ${budget} ms`);
  const runs = { eager: [], budget: [] };
  for (let rep = 0; rep < REPS; rep++) {
    for (const name of rep % 2 ? ['budget', 'eager'] : ['eager', 'budget']) {
      runs[name].push(await sitting(ctx, name === 'budget' ? budget : null));
      log(`rep ${rep + 1} ${name}: ${JSON.stringify(runs[name].at(-1))}`);
    }
  }
  ctx.dispose();
  const m = (name, key) => median(runs[name].map((r) => r[key]));
  const keys = ['chatGapP50', 'chatGapP95', 'stepP50', 'stepP95', 'rowsP50', 'chatTokS', 'programTokS'];
  const table = Object.fromEntries(
    ['eager', 'budget'].map((n) => [n, Object.fromEntries(keys.map((k) => [k, m(n, k)]))]),
  );
  console.log(
    JSON.stringify(
      {
        date: new Date().toISOString(),
        stepBudgetMs: budget,
        reps: REPS,
        ...table,
        programThroughputVsEager: table.budget.programTokS / table.eager.programTokS,
        chatP95WithinBudget: table.budget.chatGapP95 <= budget,
      },
      null,
      2,
    ),
  );
}

main().catch((e) => (console.error(e), process.exit(1)));
