'use strict';

// Parked lines in programs (issue 62): `line.park()` gives the line's lease and own cells back
// and `line.resume()` takes them again, so a program holds more lines than it has leases; under
// `deterministic: true` a search that parks gives exactly the tokens of the same search that keeps
// every line live. Every bad use is a coded error that changes nothing.

const assert = require('node:assert/strict');
const { Scheduler, BranchStore } = require('..');
const { open, rejects } = require('./helpers');

const PROMPT = 'A short history of the printing press: it began';
const SAMPLED = { temperature: 0.8 };

/**
 * A root and `width` forks, each generated, then (`park`) parked, then each resumed and generated
 * again; every fork's tokens, and the most leases the program held at once.
 */
function explore(scheduler, store, { park, width, maxBranches }) {
  const before = store.available;
  let peak = 0;
  const held = () => (peak = Math.max(peak, before - store.available));
  const result = scheduler.run(
    async (root) => {
      root.append(PROMPT);
      await root.gen({ maxTokens: 2, params: SAMPLED });
      const nodes = [];
      for (let i = 0; i < width; i++) {
        const [fork] = root.fork();
        const first = await fork.gen({ maxTokens: 4, params: SAMPLED });
        held();
        if (park) await fork.park();
        assert.equal(fork.parked, park);
        nodes.push({ fork, tokens: first.tokens });
      }
      const out = [];
      for (const { fork, tokens } of nodes) {
        if (park) await fork.resume();
        assert.equal(fork.parked, false);
        const second = await fork.gen({ maxTokens: 4, params: SAMPLED });
        held();
        out.push([...tokens, ...second.tokens]);
        if (park) await fork.park(); // parked lines are freed with the program
      }
      return out;
    },
    { maxBranches, seed: 7 },
  );
  return result.then((tokens) => ({ tokens, peak }));
}

describe('Scheduler.run: parked lines', function () {
  this.timeout(300000);
  let ctx;
  let store;
  let scheduler;
  before(async () => {
    ctx = await open({ deterministic: true, nCtx: 1024, nSeqMax: 12 });
    store = new BranchStore(ctx);
  });
  afterEach(async () => {
    if (scheduler) await scheduler.close();
    scheduler = null;
  });
  after(() => ctx && ctx.dispose());

  it('a program holds more lines than leases, and parked lines go on exactly', async () => {
    scheduler = new Scheduler(ctx);
    const live = await explore(scheduler, store, { park: false, width: 8, maxBranches: 9 });
    const parked = await explore(scheduler, store, { park: true, width: 8, maxBranches: 2 });
    assert.deepEqual(parked.tokens, live.tokens);
    assert.equal(live.peak, 9, 'kept live, the root and 8 forks hold a lease each');
    assert.equal(parked.peak, 2, 'parking, the root and one fork at a time');
    assert.ok(new Set(live.tokens.map((t) => t.join())).size > 1, 'the forks sampled different tokens');
    assert.equal(store.parkStats().parked, 0, 'the parked lines were freed with their program');
  });

  it('bad use of park and resume is a coded error that changes nothing', async () => {
    scheduler = new Scheduler(ctx);
    const text = await scheduler.run(
      async (root) => {
        await rejects(() => root.park(), 'ERR_PROGRAM_STATE', /no KV yet/);
        root.append(PROMPT);
        await root.gen({ maxTokens: 2, params: SAMPLED });
        const [a] = root.fork();
        await a.gen({ maxTokens: 3, params: SAMPLED });
        const [b] = a.fork();
        await rejects(() => a.park(), 'ERR_PROGRAM_STATE', /fork of this line has not started/);
        await b.gen({ maxTokens: 3, params: SAMPLED });
        await b.park();
        await a.park();
        await rejects(() => b.resume(), 'ERR_PROGRAM_STATE', new RegExp(`parent line ${a.id} is parked`));
        await rejects(() => a.gen({ maxTokens: 1 }), 'ERR_PROGRAM_STATE', /parked; await line.resume/);
        await rejects(async () => a.fork(), 'ERR_PROGRAM_STATE', /parked/);
        await rejects(() => a.park(), 'ERR_PROGRAM_STATE', /parked/);
        await rejects(() => root.resume(), 'ERR_PROGRAM_STATE', /not parked/);
        a.append(' and then'); // text waits for the resume
        const waiting = root.fork(2); // with the root: all 3 of the program's lines
        await rejects(() => a.resume(), 'ERR_TOO_MANY_BRANCHES');
        assert.ok(a.parked && b.parked);
        for (const w of waiting) w.release();
        await a.resume();
        await b.resume();
        const more = await a.gen({ maxTokens: 3, params: SAMPLED });
        await b.gen({ maxTokens: 2, params: SAMPLED });
        assert.equal(more.tokens.length, 3);
        return a.text;
      },
      { maxBranches: 3 },
    );
    assert.match(text, /^A short history of the printing press: it began.* and then/s);
    assert.equal(store.parkStats().parked, 0);
  });

  it('a resume past the program maxCells is ERR_KV_FULL and the line stays parked', async () => {
    scheduler = new Scheduler(ctx);
    const prompt = ctx.tokenizeSync(PROMPT, true).length;
    const ids = ctx.tokenizeSync(' the old press, the new press, the ink and the paper and the type'.repeat(4), false);
    const grow = async (line, n) => {
      await line.gen({ maxTokens: 1, params: SAMPLED }); // its branch, with nothing pending
      line.append(ids.slice(0, n));
      await line.gen({ maxTokens: 1, params: SAMPLED }); // the n tokens prefilled: about n own cells
    };
    await scheduler.run(
      async (root) => {
        root.append(PROMPT);
        await root.gen({ maxTokens: 1, params: SAMPLED });
        const [a] = root.fork();
        await grow(a, 30);
        await a.park();
        const [b] = root.fork();
        await grow(b, 40);
        await rejects(() => a.resume(), 'ERR_KV_FULL');
        assert.equal(a.parked, true);
        await b.park(); // its cells come back to the program
        await a.resume();
        const out = await a.gen({ maxTokens: 2, params: SAMPLED });
        assert.ok(out.tokens.length > 0);
      },
      { maxBranches: 3, maxCells: prompt + 60 },
    );
  });
});
