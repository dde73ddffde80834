'use strict';

// Fork admission by the step's time budget (issue 61): with `stepBudgetMs`, while a request's
// first choice generates, an extra line — a program's fork, a request's second and later choice —
// takes its branch only while the decode step predicted with one more row stays within the
// budget. A budget no step can meet keeps those steps to the lines that are not extra, yet every
// line finishes; with no request generating, or without a budget, every line is
// admitted at once.

const assert = require('node:assert/strict');
const { Scheduler } = require('..');
const { open } = require('./helpers');

const PROMPT = 'The three most useful kitchen tools are';

/** A scheduler whose onStep keeps each step's rows (`during` says which steps count) and the most held back. */
function scheduler(ctx, stepBudgetMs) {
  const seen = { rows: [], deferred: 0, during: () => true };
  const s = new Scheduler(ctx, {
    stepBudgetMs,
    onStep: ({ rows, deferred }) => {
      if (rows > 0 && seen.during()) seen.rows.push(rows);
      seen.deferred = Math.max(seen.deferred, deferred);
    },
  });
  return { s, seen, most: () => Math.max(...seen.rows) };
}

describe('Scheduler: step budget (stepBudgetMs)', function () {
  this.timeout(300000);
  let ctx;
  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 12 });
  });
  after(() => ctx && ctx.dispose());

  it("a request's n choices: all in one step without a budget, the first alone within a budget no step meets, the rest after it", async () => {
    const eager = scheduler(ctx, null);
    await eager.s.generate({ prompt: PROMPT, n: 4, maxTokens: 8, params: { temperature: 0.9 } });
    await eager.s.close();
    assert.equal(eager.most(), 4);
    assert.equal(eager.seen.deferred, 0);

    const tight = scheduler(ctx, 0.001);
    // A first request teaches the fit what a step costs; before any step the budget admits all.
    await tight.s.generate({ prompt: 'Warm up:', maxTokens: 4 });
    tight.seen.rows = [];
    const b = await tight.s.generate({ prompt: PROMPT, n: 4, maxTokens: 8, params: { temperature: 0.9 } });
    await tight.s.close();
    assert.equal(b.choices.length, 4);
    for (const [i, c] of b.choices.entries()) assert.equal(c.tokens.length, 8, `choice ${i} finished`);
    // While the first choice generates (7 decodes: the 8th token is taken without one) it runs
    // alone, as no step of 2 rows meets the budget; then the other three at once.
    assert.deepEqual(tight.seen.rows, [1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3]);
    assert.ok(tight.seen.deferred >= 1, 'extra choices were held back');
  });

  it("a program's forks beside a streaming request wait within the budget, all finish; a generous budget admits them at once", async () => {
    const program = async (root) => {
      root.append(PROMPT);
      await root.gen({ maxTokens: 2 });
      const forks = root.fork(6);
      const outs = await Promise.all(forks.map((f) => f.gen({ maxTokens: 6, params: { temperature: 0.9 } })));
      return outs.map((o) => o.tokens.length);
    };
    for (const [budget, most] of [
      [0.001, 2],
      [60000, 7],
    ]) {
      const t = scheduler(ctx, budget);
      await t.s.generate({ prompt: 'Warm up:', maxTokens: 4 });
      t.seen.rows = [];
      let requestDone = false;
      t.seen.during = () => !requestDone;
      const request = t.s.generate({ prompt: 'A long answer:', maxTokens: 40 }).then((r) => ((requestDone = true), r));
      const forks = await t.s.run(program, { maxBranches: 8, seed: 3 });
      assert.deepEqual(forks, [6, 6, 6, 6, 6, 6]);
      assert.equal((await request).choices[0].tokens.length, 40);
      await t.s.close();
      assert.equal(
        t.most(),
        most,
        `budget ${budget}: rows per step while the request ran ${JSON.stringify(t.seen.rows)}`,
      );
      assert.equal(t.seen.deferred > 0, budget < 1);
    }
  });

  it('refuses a budget that is not a positive number of milliseconds', () => {
    for (const stepBudgetMs of [0, -5, '20', Infinity])
      assert.throws(() => new Scheduler(ctx, { stepBudgetMs }), { code: 'ERR_INVALID_ARG', message: /stepBudgetMs/ });
  });
});
