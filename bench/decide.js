#!/usr/bin/env node
'use strict';

/**
 * Typed decisions (issue 41): `scheduler.decide()` timings on the default model, one run each:
 *   one        1 question over a fresh ~1,500-token state (a new Scheduler: nothing cached)
 *   eight      8 mixed questions (noul, choice, score) over another fresh state of that size
 *   again      the same 8 questions over the `eight` state again (the prefix cache holds it)
 *   four       4 different fresh states × 8 questions, the four decide() calls at once
 * with wall time, tokens prefilled (what was decoded) and input tokens (state once + questions);
 * then `beside`: the `eight` decision on a fresh state while 4 streaming chat requests generate
 * 96 tokens each, against each alone: the decision's latency and the chats' mean gap between
 * tokens, so that neither starving the other shows; then `many`: 400 questions (OpenAI's shape,
 * `scheduler.decide({ input, questions })`) over one ~2,000-token input, against one question
 * over a fresh copy of it: the tokens decoded should be the input once plus each question's own
 * text; and `doors`: the same 8 questions through POST /v1/decisions and POST /v1/systemone of an
 * in-process server (a fresh state per request, alternating doors), the mean time of each.
 * `--many=N` and `--log-lines=N` shrink the 400-question case (a smoke run: `--many=4
 * --log-lines=4 --parts=many,doors`); `--parts=` picks among rows,beside,many,doors. Peer comparisons (node-llama-cpp, xllamacpp)
 * are `npm run bench:peers -- --decide` (bench/peers.js); the labelled order-sensitivity/calibration set is bench/decide-quality.js.
 *
 * Usage: node bench/decide.js [--threads=2] [--parts=rows,beside,many,doors] [--many=400] [--log-lines=100]
 */

const os = require('node:os');
const { args, modelPath } = require('./common');

// Loaded when used, not here: bench/peers.js takes the states and questions into a process that
// runs node-llama-cpp, which must not have a second llama.cpp (ours) loaded beside its own.
const lib = () => require('..');

/** A ~1,500-token state (75 lines): a shift log whose lines differ by `seed`. */
function state(seed, length = 75) {
  const lines = Array.from(
    { length },
    (_, i) =>
      `${String(i).padStart(2, '0')}:${String((i * 7 + seed) % 60).padStart(2, '0')} hall ${(i + seed) % 9}: pump ${i % 5} checked, pressure ${(i * 13 + seed) % 90} kPa.`,
  );
  return `Maintenance log ${seed}.\n${lines.join('\n')}`;
}

const QUESTIONS = {
  leak: { type: 'noul', instructions: 'Does the log report a leak?' },
  normal: { type: 'noul', instructions: 'Were all pressures normal?' },
  hall: {
    type: 'choice',
    instructions: 'Which hall was checked most?',
    criteria: { 'hall 1': null, 'hall 2': null, 'hall 3': null },
  },
  action: {
    type: 'choice',
    instructions: 'What should happen next?',
    criteria: { nothing: 'all is fine', inspect: 'send a technician', shutdown: 'stop the pumps' },
  },
  risk: { type: 'score', instructions: 'How risky is the situation?', criteria: ['none', 'low', 'medium', 'high'] },
  busy: { type: 'score', instructions: 'How busy was the shift?', criteria: ['quiet', 'normal', 'busy'] },
  pumps: { type: 'noul', instructions: 'Was pump 4 checked?' },
  kind: {
    type: 'choice',
    instructions: 'What kind of document is this?',
    criteria: { log: null, letter: null, invoice: null },
  },
};
const ONE = { leak: QUESTIONS.leak };

async function timed(scheduler, requests) {
  const before = scheduler.stats().prefilledTokens;
  const t = performance.now();
  const results = await Promise.all(requests.map((r) => scheduler.decide(r)));
  const seconds = (performance.now() - t) / 1000;
  return {
    seconds,
    prefilled: scheduler.stats().prefilledTokens - before,
    input: results.reduce((s, r) => s + r.usage.inputTokens, 0),
    state: results[0].usage.stateTokens,
  };
}

/**
 * The four cases (one, eight, again, four) on `ctx`, each on a fresh Scheduler but `again`; the
 * peers bench (bench/peers.js) runs the same rows in its own process.
 */
async function decisionRows(ctx) {
  const rows = [];
  const fresh = async (name, requests) => {
    const scheduler = new (lib().Scheduler)(ctx);
    rows.push({ name, ...(await timed(scheduler, requests)) });
    return scheduler;
  };
  await (await fresh('one: 1 question, fresh state', [{ state: state(1), questions: ONE }])).close();
  const eight = await fresh('eight: 8 questions, fresh state', [{ state: state(2), questions: QUESTIONS }]);
  rows.push({
    name: 'again: the same 8 questions and state',
    ...(await timed(eight, [{ state: state(2), questions: QUESTIONS }])),
  });
  await eight.close();
  await (
    await fresh(
      'four: 4 fresh states × 8 questions at once',
      [3, 4, 5, 6].map((s) => ({ state: state(s), questions: QUESTIONS })),
    )
  ).close();
  return rows;
}

async function main() {
  const threads = Number(args.threads || 2);
  const parts = new Set(String(args.parts || 'rows,beside,many,doors').split(','));
  const ctx = await lib().createContext({ modelPath: modelPath(), nCtx: 16384, nSeqMax: 48, nThreads: threads });
  const rows = parts.has('rows') ? await decisionRows(ctx) : [];
  const beside = parts.has('beside') ? await besideChats(ctx) : null;
  const many = parts.has('many')
    ? await manyQuestions(ctx, Number(args.many || 400), Number(args['log-lines'] || 100))
    : null;
  ctx.dispose();
  const doors = parts.has('doors') ? await twoDoors(threads) : null;
  console.log(`machine: ${os.cpus().length} cores (${os.cpus()[0].model}), ${threads} threads, no GPU`);
  if (rows.length > 0) {
    console.log('| case | wall s | tokens prefilled | input tokens | state tokens |');
    console.log('|---|---|---|---|---|');
    for (const r of rows)
      console.log(`| ${r.name} | ${r.seconds.toFixed(2)} | ${r.prefilled} | ${r.input} | ${r.state} |`);
    console.log(`eight / one: ${(rows[1].seconds / rows[0].seconds).toFixed(2)} ×`);
  }
  if (beside) {
    console.log('| beside 4 streaming chats | decision s | chats: mean ms between tokens |');
    console.log('|---|---|---|');
    console.log(`| each alone | ${beside.aloneDecision.toFixed(2)} | ${beside.aloneGap.toFixed(1)} |`);
    console.log(`| together | ${beside.decision.toFixed(2)} | ${beside.gap.toFixed(1)} |`);
  }
  if (many) {
    console.log(
      '| many questions, one input | wall s | tokens prefilled | input once + questions | input (state) tokens |',
    );
    console.log('|---|---|---|---|---|');
    for (const r of many)
      console.log(`| ${r.name} | ${r.seconds.toFixed(2)} | ${r.prefilled} | ${r.expected} | ${r.state} |`);
    console.log(`${many[1].name} / one: ${(many[1].seconds / many[0].seconds).toFixed(2)} ×`);
  }
  if (doors) {
    console.log('| 8 questions, fresh state per request | mean s | requests |');
    console.log('|---|---|---|');
    for (const [door, times] of Object.entries(doors))
      console.log(`| ${door} | ${(times.reduce((a, b) => a + b, 0) / times.length).toFixed(2)} | ${times.length} |`);
  }
}

/** The QUESTIONS in OpenAI's shape (predicate, choice, score), in their order. */
function openAIQuestions(questions = QUESTIONS) {
  return Object.entries(questions).map(([name, q]) => {
    if (q.type === 'noul') return { type: 'predicate', name, instructions: q.instructions };
    if (q.type === 'choice')
      return {
        type: 'choice',
        name,
        instructions: q.instructions,
        choices: Object.keys(q.criteria).map((value) => ({ value })),
      };
    return { type: 'score', name, instructions: q.instructions, levels: q.criteria.map((label) => ({ label })) };
  });
}

/**
 * `count` questions (the eight, cycled, each with its number so every fork's text differs) over
 * one input of `logLines` lines, against one question over a fresh copy of that input; each on a
 * fresh Scheduler. `expected`: the input once plus every question's own tokens.
 */
async function manyQuestions(ctx, count, logLines) {
  const { Scheduler } = lib();
  const eight = openAIQuestions();
  const run = async (name, input, questions) => {
    const scheduler = new Scheduler(ctx);
    const before = scheduler.stats().prefilledTokens;
    const t = performance.now();
    const result = await scheduler.decide({ input, questions });
    const seconds = (performance.now() - t) / 1000;
    const prefilled = scheduler.stats().prefilledTokens - before;
    await scheduler.close();
    return { name, seconds, prefilled, expected: result.usage.inputTokens, state: result.usage.stateTokens };
  };
  const questions = Array.from({ length: count }, (_, i) => {
    const q = eight[i % eight.length];
    return { ...q, name: `q${i}`, instructions: `(${i + 1}) ${q.instructions}` };
  });
  return [
    await run('one question', state(11, logLines), questions.slice(0, 1)),
    await run(`${count} questions`, state(12, logLines), questions),
  ];
}

/** The eight questions through both doors of an in-process server, alternating, fresh states. */
async function twoDoors(threads, rounds = Number(args.rounds || 4)) {
  const server = await lib().createServer({ modelPath: modelPath(), nThreads: threads, nCtx: 8192, ui: false });
  const { url } = await server.listen(0, '127.0.0.1');
  const post = async (route, body) => {
    const t = performance.now();
    const res = await fetch(`${url}${route}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    if (res.status !== 200) throw new Error(`${route}: HTTP ${res.status} ${await res.text()}`);
    await res.json();
    return (performance.now() - t) / 1000;
  };
  const times = { '/v1/decisions': [], '/v1/systemone': [] };
  try {
    for (let i = 0; i < rounds; i++) {
      const lines = Number(args['log-lines'] || 75);
      times['/v1/decisions'].push(
        await post('/v1/decisions', { input: state(100 + 2 * i, lines), questions: openAIQuestions() }),
      );
      times['/v1/systemone'].push(
        await post('/v1/systemone', { state: state(101 + 2 * i, lines), questions: QUESTIONS }),
      );
    }
  } finally {
    await server.close();
  }
  return times;
}

/** 4 streaming chats (96 tokens each, end of generation banned); resolves with their mean gap between tokens. */
async function chats(scheduler) {
  const gaps = [];
  await Promise.all(
    [1, 2, 3, 4].map(async (i) => {
      const gen = scheduler.generate({
        messages: [{ role: 'user', content: `Tell me a long story about lighthouse number ${i}.` }],
        maxTokens: 96,
        params: { temperature: 0 },
      });
      let last = performance.now();
      for await (const event of gen) {
        if (event.token === null) continue;
        const now = performance.now();
        gaps.push(now - last);
        last = now;
      }
    }),
  );
  return gaps.reduce((a, b) => a + b, 0) / gaps.length;
}

/** The 8-question decision on a fresh state beside 4 streaming chats, and each alone (fresh schedulers). */
async function besideChats(ctx) {
  const { Scheduler } = lib();
  const alone = new Scheduler(ctx);
  const aloneGap = await chats(alone);
  let t = performance.now();
  await alone.decide({ state: state(7), questions: QUESTIONS });
  const aloneDecision = (performance.now() - t) / 1000;
  await alone.close();
  const together = new Scheduler(ctx);
  const chatting = chats(together);
  t = performance.now();
  await together.decide({ state: state(8), questions: QUESTIONS });
  const decision = (performance.now() - t) / 1000;
  const gap = await chatting;
  await together.close();
  return { aloneDecision, aloneGap, decision, gap };
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { state, QUESTIONS, ONE, decisionRows };
