'use strict';

// A whole Scheduler step on fakes (issue 61): the real queue, programs, lines, prefix cache and
// step budget of lib/scheduler/, over a fake context and store that record every batched call.
// What a step plans shows in its `plan` (the lines that took branches, each prefill entry, the
// decode rows), and the calls it made show in the store's log: ONE scored prefill and ONE
// produce + ONE commit per step, whatever the number of lines.

const assert = require('node:assert/strict');
const { runStep } = require('../../lib/scheduler/step');
const { Queue } = require('../../lib/scheduler/queue');
const { Programs } = require('../../lib/scheduler/programs');
const { PrefixCache } = require('../../lib/scheduler/prefix-cache');
const { StepBudget } = require('../../lib/scheduler/step-budget');
const { SchedulerEvents } = require('../../lib/scheduler/events');
const { requestProgram } = require('../../lib/scheduler/request');

const N_CTX = 512;
const N_SEQ_MAX = 8;

/** A fake context and store: sequences and cells counted, every batched call logged. */
function fakeEngine() {
  const log = [];
  let nextSeq = 0;
  const live = new Set();
  /** A branch of the fake: its tokens stand for its cells; produce samples token 7 + its seq. */
  const branch = (tokens) => {
    const b = {
      seqId: nextSeq++,
      tokens: [...tokens],
      disposed: false,
      get position() {
        return b.tokens.length;
      },
      fork: () => branch(b.tokens),
      forkAt: (at) => branch(b.tokens.slice(0, at)),
      prune() {
        b.disposed = true;
        live.delete(b);
        return Promise.resolve();
      },
      setSamplerParams() {},
      setGrammar() {},
    };
    live.add(b);
    return b;
  };
  const cells = () => new Set([...live].flatMap((b) => b.tokens.map((t, i) => `${i}:${t}`))).size;
  const store = {
    get available() {
      return N_SEQ_MAX - live.size;
    },
    kvPressure: () => ({ cellsUsed: cells(), nCtx: N_CTX, remaining: N_CTX - cells() }),
    async scorePerToken(entries) {
      log.push({ call: 'prefill', entries: entries.map(([b, tokens]) => [b.seqId, tokens.length]) });
      for (const [b, tokens] of entries) b.tokens.push(...tokens);
      return entries.map(() => null);
    },
    produce(branches) {
      log.push({ call: 'produce', rows: branches.length });
      return branches.map((b) => ({ token: 7 + (b.seqId % 3), text: `<${7 + (b.seqId % 3)}>` }));
    },
    async commit(pairs) {
      log.push({ call: 'commit', rows: pairs.length });
      for (const [b, token] of pairs) b.tokens.push(token);
    },
  };
  const ctx = {
    nCtx: N_CTX,
    nSeqMax: N_SEQ_MAX,
    nOutputs: 64,
    nBatch: 64,
    vocabSize: 100,
    hasProjector: false,
    disposed: false,
    slidingWindow: 0,
    tokenToText: (t) => `<${t}>`,
  };
  return { ctx, store, log, newBranch: () => branch([]) };
}

/** Runs steps until `promise` settles (a request ends in the step after its last token: `collect`). */
async function stepsUntil(step, promise) {
  let settled = false;
  const done = Promise.resolve(promise).finally(() => (settled = true));
  for (let i = 0; i < 20 && !settled; i++) await step();
  return done;
}

/** The Scheduler's parts (as lib/Scheduler.js wires them) over the fake engine. */
function fakeScheduler(stepBudgetMs = null) {
  const engine = fakeEngine();
  const cache = new PrefixCache({ slidingWindow: 0, tiers: null });
  const budget = new StepBudget(stepBudgetMs);
  const programs = new Programs({ cache, store: engine.store, budget });
  const queue = new Queue({ maxQueue: 16, maxRunning: Infinity });
  const counters = { steps: 0, prefilledTokens: 0, completed: 0, draftTokens: 0, acceptedDraftTokens: 0 };
  const env = {
    ctx: engine.ctx,
    vocabSize: 100,
    defaultMaxTokens: 8,
    jsonSchemaToGrammar: async () => 'root ::= "x"',
    spec: null,
    parseSpecial: false,
    newBranch: engine.newBranch,
    cache,
    events: new SchedulerEvents(),
    counters,
    decideOnLine: null,
    wake: () => {},
  };
  const parts = {
    ctx: engine.ctx,
    store: engine.store,
    cache,
    queue,
    programs,
    budget,
    systemPrompts: null,
    counters,
    options: { prefillChunk: 256, spec: null },
  };
  const submit = (request) => {
    const { program, generation } = requestProgram(request, env);
    queue.add(program);
    return { program, generation };
  };
  return { engine, parts, budget, submit, step: () => runStep(parts, false) };
}

describe('a Scheduler step on fakes (plan, one prefill, one decode)', () => {
  it('admits two requests, prefills both prompts in ONE call, forks the choices and decodes all rows at once', async () => {
    const { engine, submit, step } = fakeScheduler();
    const a = submit({ tokens: [1, 2, 3, 4, 5], n: 2, maxTokens: 3, params: { temperature: 0 } });
    const b = submit({ tokens: [9, 8, 7], maxTokens: 3, params: { temperature: 0 } });
    const first = await step();
    const [ida, idb] = [a.program.id, b.program.id];
    // The plan as data: both prompt lines took branches and were prefilled whole (nothing scored),
    // then their choices forked the filled prompts and decoded in the same step.
    assert.deepEqual(first.plan.branches.slice(0, 2), [ida, idb]);
    assert.deepEqual(
      first.plan.prefill.map((p) => [p.line, p.tokens, p.scored, p.image]),
      [
        [ida, 5, false, false],
        [idb, 3, false, false],
      ],
    );
    assert.deepEqual(first.plan.decode.sort(), [`${ida}.0`, `${ida}.1`, `${idb}.0`].sort());
    assert.deepEqual([first.prefillTokens, first.rows], [8, 3]);
    assert.deepEqual(
      engine.log.map((c) => c.call),
      ['prefill', 'produce', 'commit'],
      'one prefill, one produce, one commit for every line of both requests',
    );
    assert.deepEqual(
      engine.log[0].entries.map(([, n]) => n),
      [5, 3],
    );
    // The next steps decode only: 3 rows each, until maxTokens ends every choice.
    engine.log.length = 0;
    const second = await step();
    assert.deepEqual([second.prefillTokens, second.rows, second.plan.prefill, second.plan.branches], [0, 3, [], []]);
    assert.deepEqual(
      engine.log.map((c) => [c.call, c.rows]),
      [
        ['produce', 3],
        ['commit', 3],
      ],
    );
    const third = await step();
    assert.deepEqual([third.rows, third.plan.decode.length], [0, 3], 'the last tokens are taken, not decoded');
    const [ra, rb] = await stepsUntil(step, Promise.all([a.generation, b.generation]));
    assert.equal(ra.choices.length, 2);
    assert.deepEqual(
      ra.choices.map((c) => c.tokens.length),
      [3, 3],
    );
    assert.equal(rb.choices[0].tokens.length, 3);
    assert.deepEqual([ra.usage.promptTokens, rb.usage.promptTokens], [5, 3]);
  });

  it('a prompt longer than prefillChunk is planned over several steps, decoding only once it is in', async () => {
    const { engine, parts, submit, step } = fakeScheduler();
    parts.options.prefillChunk = 4;
    const long = submit({ tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], maxTokens: 1, params: { temperature: 0 } });
    const id = long.program.id;
    const plans = [];
    for (let i = 0; i < 3; i++) plans.push((await step()).plan);
    assert.deepEqual(
      plans.map((p) => p.prefill.map((e) => e.tokens)),
      [[4], [4], [2]],
      'at most prefillChunk tokens a step',
    );
    assert.deepEqual(
      plans.map((p) => p.decode),
      [[], [], [`${id}.0`]],
    );
    assert.deepEqual(
      engine.log.filter((c) => c.call === 'prefill').map((c) => c.entries.length),
      [1, 1, 1],
    );
    assert.equal((await stepsUntil(step, long.generation)).choices[0].tokens.length, 1);
  });

  it('a second request with the same prompt forks the cached prefix: nothing of it is prefilled again', async () => {
    const { engine, submit, step } = fakeScheduler();
    const prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3];
    const one = submit({ tokens: prompt, maxTokens: 1, params: { temperature: 0 } });
    await stepsUntil(step, one.generation);
    engine.log.length = 0;
    const two = submit({ tokens: prompt, maxTokens: 2, params: { temperature: 0 } });
    const next = await step();
    assert.deepEqual(next.plan.prefill, [], 'the prompt came from the cache');
    assert.equal(next.rows, 1);
    const result = await stepsUntil(step, two.generation);
    assert.equal(result.usage.cachedPromptTokens, prompt.length);
    assert.ok(!engine.log.some((c) => c.call === 'prefill'));
  });

  it("with a step budget, a request's extra choices wait while the predicted step is over it, then start together", async () => {
    const { budget, submit, step } = fakeScheduler(25);
    // Steps measured before: 10 ms a row (the fake's own steps take ~0 ms and pull the line down later).
    for (const rows of [1, 2, 4, 8]) budget.observe(rows, 10 * rows);
    const r = submit({ tokens: [4, 5, 6], n: 4, maxTokens: 4, params: { temperature: 0 } });
    const id = r.program.id;
    const first = await step();
    // The first choice is never held back; its 3 extra choices need 4 rows (40 ms): all wait.
    assert.deepEqual(first.plan.branches, [id, `${id}.0`]);
    assert.deepEqual(first.plan.decode, [`${id}.0`]);
    assert.equal(budget.deferred, 3);
    const started = [];
    let settled = false;
    r.generation.then(() => (settled = true));
    for (let i = 0; i < 40 && !settled; i++) {
      const { plan } = await step();
      if (plan.branches.length > 0) started.push(plan.branches);
    }
    assert.deepEqual(
      started,
      [[`${id}.1`, `${id}.2`, `${id}.3`]],
      'the three start in one step, once the fit has room',
    );
    const result = await r.generation;
    assert.deepEqual(
      result.choices.map((c) => c.tokens.length),
      [4, 4, 4, 4],
    );
  });
});
