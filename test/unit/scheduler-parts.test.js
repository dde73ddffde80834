'use strict';

// The Scheduler's parts that need no model: the radix index, stop strings, the request life
// cycle and admission, the Scheduler's options and its step events, the decode phase's rows (the
// prefix cache: ./prefix-cache.test.js).

const assert = require('node:assert/strict');
const { RadixTree } = require('../../lib/scheduler/radix');
const { StopMatcher } = require('../../lib/scheduler/stops');
const { PrefixCache, MIN_PARTIAL_REUSE } = require('../../lib/scheduler/prefix-cache');
const { requestProgram } = require('../../lib/scheduler/request');
const { SchedulerEvents, ProgramEvents } = require('../../lib/scheduler/events');
const { schedulerOptions, parseBytes } = require('../../lib/scheduler/options');
const { StepCost, DraftLength } = require('../../lib/decode/speculation');
const { produceAll, commitRows } = require('../../lib/decode/rows');
const { Programs } = require('../../lib/scheduler/programs');
const { LineStart } = require('../../lib/scheduler/line-start');
const { Line } = require('../../lib/scheduler/line');
const { Tally } = require('../../lib/scheduler/usage');
const { PeekJob, GenJob } = require('../../lib/scheduler/jobs');

const { fakeBranch, range } = require('./fakes');

describe('Scheduler parts (no model)', () => {
  it('RadixTree: longest cached prefix, shared runs, splits and deletes', () => {
    const t = new RadixTree();
    t.insert([1, 2, 3, 4], 'a');
    t.insert([1, 2, 3, 4, 5, 6], 'b');
    t.insert([1, 2, 9], 'c');
    assert.equal(t.size, 3);
    let m = t.match([1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual([m.prefix.value, m.prefix.length], ['b', 6]);
    m = t.match([1, 2, 3, 4, 5, 8]);
    assert.deepEqual([m.prefix.value, m.prefix.length], ['a', 4]);
    assert.deepEqual([m.shared.value, m.shared.length], ['b', 5]);
    m = t.match([1, 2, 7]);
    assert.equal(m.prefix, null);
    assert.equal(m.shared.length, 2);
    assert.ok(['a', 'b', 'c'].includes(m.shared.value));
    assert.deepEqual(t.match([5]), { prefix: null, shared: null });
    assert.equal(t.delete([1, 2, 3]), false, 'no value stored there');
    assert.equal(t.delete([1, 2, 3, 4]), true);
    m = t.match([1, 2, 3, 4, 5, 6]);
    assert.deepEqual([m.prefix.value, m.prefix.length], ['b', 6]);
    assert.equal(t.match([1, 2, 3, 4]).prefix, null);
    t.delete([1, 2, 3, 4, 5, 6]);
    t.delete([1, 2, 9]);
    assert.equal(t.size, 0);
    assert.equal(t.root.children.size, 0, 'empty nodes are compacted away');
    assert.deepEqual([...t.values()], []);
  });

  it('StopMatcher: holds back possible starts, cuts at the earliest stop', () => {
    const m = new StopMatcher(['</s>', 'END']);
    assert.equal(m.push('Hello <'), 'Hello ');
    assert.equal(m.push('/'), '');
    assert.equal(m.push('x> E'), '</x> ');
    assert.equal(m.push('N'), '');
    assert.equal(m.push('D and more'), '');
    assert.equal(m.stopped, true);
    assert.equal(m.text, 'Hello </x> ');
    const open = new StopMatcher(['###']);
    assert.equal(open.push('a #'), 'a ');
    assert.equal(open.push('#'), '');
    assert.equal(open.flush(), '##');
    assert.equal(open.text, 'a ##');
    const none = new StopMatcher([]);
    assert.equal(none.push('abc'), 'abc');
  });

  describe("a request's Program", () => {
    const env = () => ({
      ctx: {},
      vocabSize: 100,
      defaultMaxTokens: 8,
      jsonSchemaToGrammar: async () => 'root ::= "x"',
      events: new SchedulerEvents(),
      cache: new PrefixCache(),
      spec: null,
      wake: () => {},
    });
    const make = (request, e = env()) => requestProgram(request, e).program;

    it('starts queued and moves only along its life cycle', () => {
      const req = make({ prompt: 'hi' });
      assert.equal(req.state, 'queued');
      assert.throws(
        () => req.to('running'),
        (e) => e.code === 'ERR_INTERNAL' && /from queued to running/.test(e.message),
      );
      for (const state of ['ready', 'running', 'ending', 'done']) req.to(state);
      assert.throws(
        () => req.to('failed'),
        (e) => e.code === 'ERR_INTERNAL',
      );
      assert.equal(req.countsAsRunning, true);
    });

    it('checks its inputs with coded errors that name the field', () => {
      const bad = [
        [{}, /exactly one of prompt, tokens or messages/],
        [{ prompt: 'a', tokens: [1] }, /exactly one/],
        [{ tokens: [100] }, /token ids in \[0, 100\)/],
        [{ prompt: 'a', n: '2' }, /request.n/],
        [{ prompt: 'a', stop: 5 }, /request.stop/],
        [{ prompt: 'a', seed: 2 ** 32 }, /request.seed/],
        [{ prompt: 'a', grammar: 'g', jsonSchema: {} }, /grammar or jsonSchema/],
      ];
      for (const [request, message] of bad)
        assert.throws(
          () => make(request),
          (e) => e.code === 'ERR_INVALID_ARG' && message.test(e.message),
          JSON.stringify(request),
        );
      assert.equal(make({ prompt: 'a', stop: ['', 'x'], params: { seed: 5, temperature: 0 } }).state, 'queued');
    });

    it('needs: its cached start, and the cells and leases beyond it; begin makes its lines', async () => {
      const e = env();
      const cached = e.cache.open([1, 2, 3], fakeBranch(3, []));
      e.cache.filled(cached);
      const req = make({ tokens: [1, 2, 3, 4, 5], n: 2, maxTokens: 5, logprobs: true, params: { seed: 5 } }, e);
      const ctx = { nCtx: 64, nSeqMax: 8 };
      await req.prepare(ctx, null);
      assert.deepEqual(req.restoreKey, [1, 2, 3, 4, 5], 'the tiers may restore its prompt');
      req.budget.prompt.cachePoints.unshift(2); // a system prompt's end below the cached start needs no branch
      req.to('ready');
      const need = req.needs(e.cache);
      assert.deepEqual(need, { entry: cached, cut: null, start: 3, cells: 2 + 2 * 5, leases: 2 + 1 });
      req.start(need);
      assert.equal(req.state, 'running');
      assert.deepEqual(
        [req.promptLine.lineStart.planned.start, req.leasesToCome, req.tally.usage.promptTokens],
        [3, 3, 5],
      );
      assert.equal(cached.pins, 1, 'the cached start admission counted on is pinned until the prompt line starts');
      assert.deepEqual(
        req.lines.slice(1).map((l) => l.job.params.seed),
        [5, 6],
      );
      assert.deepEqual(
        req.lines.map((l) => [l.id, l.lineStart.parent && l.lineStart.parent.id, l.tokens.length]),
        [
          [req.id, null, 5],
          [`${req.id}.0`, req.id, 5],
          [`${req.id}.1`, req.id, 5],
        ],
      );
      // The unfilled prompt (from the planned start) and every token left to generate.
      assert.equal(req.cellsToCome(), 2 + 2 * 5);
      req.lines[1].job.tokens.push(7, 8); // two tokens taken
      req.lines[2].endJob('length'); // its choice ended: it writes no more
      assert.equal(req.cellsToCome(), 2 + 3);
      // Log-probabilities need every token sampled, not drafted: arming with a spec opens no drafter.
      const branch = { setSamplerParams: () => {}, setGrammar: () => {} };
      const gen = req.lines[1].job;
      assert.equal(gen.sink.index, 0);
      gen.arm(branch, [], { source: { open: () => assert.fail('drafted') }, maxDraft: 4 });
      assert.deepEqual([gen.state, gen.drafter], ['sampling', null]);
    });

    it('needs: a cut where the prompt leaves a cached prefix (own lease), only when a lease is left for it', async () => {
      const shared = range(0, 40);
      const prompt = [...shared, ...range(60, 80)];
      for (const [nSeqMax, cut] of [
        [8, 40],
        [2, null],
      ]) {
        // A model with a 32-token sliding window: an entry past it is never forked part-way.
        const e = { ...env(), ctx: { nSeqMax }, cache: new PrefixCache({ slidingWindow: 32 }) };
        // Another request's whole prompt: the shared run, then its own end.
        e.cache.filled(e.cache.open([...shared, ...range(80, 99)], fakeBranch(59, [])));
        const req = make({ tokens: prompt, maxTokens: 4 }, e);
        await req.prepare({ nCtx: 256, nSeqMax }, null);
        req.to('ready');
        const need = req.needs(e.cache);
        assert.deepEqual([need.cut, need.start, need.leases], [cut, 0, cut === null ? 2 : 3], `nSeqMax ${nSeqMax}`);
        req.start(need);
        assert.deepEqual(req.promptLine.lineStart.cachePoints, cut === null ? [60] : [40, 60]);
      }
      // A run shorter than MIN_PARTIAL_REUSE past the start is no reason for an entry.
      const c = new PrefixCache();
      c.filled(c.open(range(0, MIN_PARTIAL_REUSE - 1), fakeBranch(MIN_PARTIAL_REUSE - 1, [])));
      assert.equal(c.splitPoint([...range(0, MIN_PARTIAL_REUSE - 1), 500, 501], 0), null);
      assert.equal(c.splitPoint([...range(0, 40), 7], 0), null, 'nothing cached shares it');
    });
  });

  describe('LineStart: how a line gets its KV, and the cache entries it fills', () => {
    const env = (cache) => ({ cache, ctx: {}, hinted: true });

    it("a request's prompt cached whole uses the entry's branch as is; filled to its end, it borrows its last entry", () => {
      const cache = new PrefixCache();
      const pruned = [];
      const prompt = range(0, 30);
      const whole = cache.open(prompt, fakeBranch(30, pruned));
      cache.filled(whole);
      const start = LineStart.prompt([30]);
      const got = start.begin(env(cache), prompt, prompt.slice(), 0);
      assert.deepEqual([got.branch, got.pending, got.lease, start.borrowed], [whole.branch, [], false, true]);
      assert.deepEqual([start.cached, start.starts], [30, 1]);
      assert.equal(whole.pins, 1, 'pinned until the line is freed');
      start.free(cache);
      assert.equal(whole.pins, 0);
      // A new prompt: its segment is opened (hinted, pinned), and once filled the line borrows it.
      const other = LineStart.prompt([10, 20]);
      const branch = fakeBranch(0, pruned);
      other.open(env(cache), range(100, 120), 0, branch);
      assert.equal(other.segmentEnd, 10);
      const noSpare = () => assert.fail("a request's leases were reserved: it never asks for a spare one");
      const next = other.segmentFilled(cache, false, noSpare);
      assert.equal(next.lease, true, 'it goes on in a fork of the filled entry');
      other.open(env(cache), range(100, 120), 10, next.branch);
      assert.equal(other.segmentEnd, 20);
      assert.equal(other.segmentFilled(cache, true, noSpare).lease, false);
      assert.equal(other.borrowed, true);
      const opened = [...cache.entries()].filter((e) => e.tokens[0] === 100);
      assert.deepEqual(
        opened.map((e) => [e.tokens.length, e.ready, e.hinted]),
        [
          [10, true, true],
          [20, true, true],
        ],
      );
    });

    it("a program's line keeps its entry only with a spare lease; a fork starts from an entry holding its own text", () => {
      const cache = new PrefixCache();
      const pruned = [];
      const tokens = range(0, MIN_PARTIAL_REUSE + 4);
      const line = LineStart.fresh();
      assert.equal(line.cachedStart(cache, tokens).length, 0, 'nothing cached yet');
      line.open(env(cache), tokens, 0, fakeBranch(0, pruned));
      assert.equal(
        line.segmentFilled(cache, true, () => false),
        null,
        'no spare lease: nothing is cached',
      );
      assert.equal(cache.size, 0);
      line.open(env(cache), tokens, 0, fakeBranch(0, pruned));
      assert.equal(line.segmentFilled(cache, true, () => true).lease, true);
      assert.equal(cache.size, 1);
      const parent = { lineStart: { images: [] }, state: 'waiting' };
      const fork = LineStart.fork(parent, 2);
      assert.equal(fork.fromCache(cache, tokens.slice(0, 3), 2), null, 'too little of its own text');
      const from = fork.fromCache(cache, [...tokens, 99], 2);
      assert.equal(from.length, tokens.length);
      // Its parent has no branch yet, but the entry holds the fork's own text: it starts from there.
      const begun = fork.begin(env(cache), [...tokens, 99], [], 0);
      assert.deepEqual([begun.pending, begun.lease, fork.cached], [[99], true, tokens.length - 2]);
      assert.equal(LineStart.fork(parent, 2).begin(env(cache), [1, 2, 3], [], 0), null, 'it waits for its parent');
    });

    it('a waiting fork keeps its parent needed only while it needs its KV itself (not after its start failed)', () => {
      const lineEnv = {
        ctx: {},
        cache: new PrefixCache(),
        events: new ProgramEvents(new SchedulerEvents(), 'p1'),
        hinted: false,
      };
      const env = { ...lineEnv, tally: new Tally() };
      const parent = new Line(env, 'p1.0', LineStart.fresh(), [1, 2, 3]);
      const fork = new Line(env, 'p1.1', LineStart.fork(parent, 3), [1, 2, 3]);
      assert.deepEqual([parent.needed, fork.needed], [false, false], 'nothing asked of either yet');
      const failed = fork.start(new PeekJob(5)).catch((e) => e.message);
      assert.deepEqual([parent.needed, fork.needed], [true, true], "the fork waits for its parent's KV");
      fork.endJob(null, new Error('its start failed')); // what a run program's lineFailed does
      assert.equal(parent.needed, false, 'a failed fork no longer keeps its parent (and the Scheduler) busy');
      parent.release(false);
      assert.equal(parent.collectable, false, 'the fork may still start: its parent stays');
      fork.release(false);
      assert.equal(parent.collectable, true);
      return failed.then((message) => assert.equal(message, 'its start failed'));
    });

    it("a speculative step's accepted tokens stop at a gen a token listener ended (nothing taken after it)", async () => {
      const tokens = range(0, MIN_PARTIAL_REUSE + 4);
      const scheduler = new SchedulerEvents();
      const env = { ctx: {}, cache: new PrefixCache(), events: new ProgramEvents(scheduler, 'p1'), hinted: false };
      const lineEnv = { ...env, tally: new Tally() };
      const cached = LineStart.fresh(); // the line starts from a cache entry holding its tokens
      cached.open(env, tokens, 0, fakeBranch(0));
      cached.segmentFilled(env.cache, true, () => true);
      const line = new Line(lineEnv, 'p1.0', LineStart.fresh(), tokens.slice());
      line.materialize(() => false);
      assert.deepEqual([line.state, line.computed, line.decoding], ['live', tokens.length, false]);
      const gen = new GenJob({ maxTokens: 8, stops: [], params: {}, grammar: null });
      const done = line.start(gen);
      scheduler.subscribe((e) => e.event === 'token' && line.endJob('abort')); // e.g. a listener's abort
      const accepted = [
        { token: 8, text: 'a' },
        { token: 9, text: 'b' },
      ];
      line.verified({ token: 7, accepted, next: null, drafted: 2 });
      const result = await done;
      assert.deepEqual([result.finishReason, result.tokens], ['abort', [8]]);
      assert.deepEqual(line.tokens, [...tokens, 8], 'the line holds what its gen returned');
      assert.equal(lineEnv.tally.usage.completionTokens, 1, 'usage counts what its gen returned');
    });
  });

  /**
   * The decode phase's stand-ins: a branch whose sampling (`fails: 'produce'`) or commit
   * (`fails: 'commit'`) throws, and a store whose batched calls then fail too (so the per-branch
   * and per-owner fallbacks must find whose), logging what each commit held.
   */
  const decodeBranch = (id, fails = null) => ({
    id,
    fails,
    produce() {
      if (fails === 'produce') throw new Error(`grammar ${id}`);
      return { token: id, text: '' };
    },
  });
  const decodeStore = (log = []) => ({
    produce(branches) {
      if (branches.some((b) => b.fails === 'produce')) throw new Error('batch');
      return branches.map((b) => ({ token: b.id, text: '' }));
    },
    async commit(pairs) {
      log.push(pairs.map(([b]) => b.id));
      if (pairs.some(([b]) => b.fails === 'commit')) throw new Error(`commit ${pairs.map(([b]) => b.id)}`);
    },
    async commitDrafts(list) {
      log.push(list.map(([b, , draft]) => `${b.id}+${draft.length}`));
      if (list.some(([b]) => b.fails === 'commit')) throw new Error('drafts');
      return list.map(([, , draft]) => ({
        accepted: draft.slice(0, 1).map((t) => ({ token: t, text: '' })),
        next: null,
      }));
    },
  });

  describe('rows: the decode phase, data in and data out', () => {
    const store = decodeStore;
    const branch = decodeBranch;

    it('produces for every row once, per branch only to find whose sampling failed, and keeps carried tokens', () => {
      const carried = { token: 99, text: '' };
      const rows = [{ branch: branch(1) }, { branch: branch(2), carried }, { branch: branch(3) }];
      assert.deepEqual(
        produceAll(store([]), rows).map((p) => p.token),
        [1, 99, 3],
      );
      const out = produceAll(store([]), [{ branch: branch(1) }, { branch: branch(2, 'produce') }]);
      assert.equal(out[0].token, 1);
      assert.ok(out[1] instanceof Error && /grammar 2/.test(out[1].message));
    });

    it("commits once; when that fails, each owner alone, and only the failing owner's commits carry the error", async () => {
      const log = [];
      const a = branch(1);
      const b = branch(2, 'commit');
      const c = branch(3);
      const commits = [
        { branch: a, owner: 'A', token: 1 },
        { branch: b, owner: 'B', token: 2 },
        { branch: c, owner: 'A', token: 3 },
      ];
      const { outcomes } = await commitRows(store(log), commits, null);
      assert.deepEqual(log, [[1, 2, 3], [1, 3], [2]]);
      assert.deepEqual(outcomes[0], { verified: null });
      assert.deepEqual(outcomes[2], { verified: null });
      assert.match(outcomes[1].error.message, /commit 2/);
      const empty = await commitRows(store(log), [], null);
      assert.deepEqual([empty.outcomes, empty.drafted, empty.accepted], [[], 0, 0]);
    });

    it('speculating: drafts go into one commit with the plain rows; a failing draft source fails only the owners that drafted', async () => {
      const cost = new StepCost();
      const ctx = { nOutputs: 64, nBatch: 64 };
      const spec = (drafter) => ({
        drafter,
        length: new DraftLength({ maxDraft: 2, cost, adaptive: false }),
        limit: 8,
      });
      const drafter = { draft: async (token, k) => Array.from({ length: k }, (_, i) => token * 10 + i) };
      const log = [];
      const steps = cost.n;
      const ok = await commitRows(
        store(log),
        [
          { branch: branch(1), owner: 'A', token: 1, spec: spec(drafter) },
          { branch: branch(2), owner: 'B', token: 2 },
        ],
        { ctx, spec: { source: {}, cost } },
      );
      assert.deepEqual(log, [['1+2', '2+0']]);
      assert.deepEqual([ok.drafted, ok.accepted], [2, 1]);
      assert.equal(cost.n, steps, 'the step is timed until the caller applied its outcomes');
      ok.applied();
      assert.ok(cost.n > steps);
      assert.deepEqual(ok.outcomes[0].verified, { accepted: [{ token: 10, text: '' }], next: null, drafted: 2 });
      assert.deepEqual(ok.outcomes[1].verified, { accepted: [], next: null, drafted: 0 });
      const broken = { draft: async () => Promise.reject(new Error('source gone')) };
      const failed = await commitRows(
        store(log),
        [
          { branch: branch(3), owner: 'A', token: 3, spec: spec(broken) },
          { branch: branch(4), owner: 'A', token: 4 },
          { branch: branch(5), owner: 'B', token: 5 },
        ],
        { ctx, spec: { source: {}, cost } },
      );
      assert.deepEqual(log[1], ['5+0'], "owner A's rows are not committed");
      assert.match(failed.outcomes[0].error.message, /source gone/);
      assert.match(failed.outcomes[1].error.message, /source gone/);
      assert.deepEqual(failed.outcomes[2].verified, { accepted: [], next: null, drafted: 0 });
      const alone = await commitRows(store(log), [{ branch: branch(6), owner: 'A', token: 6, spec: spec(broken) }], {
        ctx,
        spec: { source: {}, cost },
      });
      assert.equal(log.length, 2, 'nothing left to decode: no commit');
      assert.match(alone.outcomes[0].error.message, /source gone/);
    });
  });

  describe('Programs.decode: what became of each row, told to its line; failures to its program', () => {
    const branch = decodeBranch;
    const store = decodeStore();
    /** A program whose lineFailed ends all its lines' jobs (a request fails whole). */
    const program = () => ({
      failures: [],
      lines: [],
      lineFailed(line, e) {
        this.failures.push([line.id, e.message]);
        for (const l of this.lines) l.job = null;
      },
    });
    const lineOf = (p, id, { drafter = null, verify = () => {} } = {}) => {
      const job = { maxTokens: 8, tokens: [], drafter, draftLength: null, next: undefined };
      const line = {
        id,
        job,
        decoding: true,
        heard: [],
        take: (produced) => (line.heard.push(`take ${produced.token}`), true),
        committed: (token) => line.heard.push(`committed ${token}`),
        verified: (v) => (line.heard.push(`verified ${v.accepted.length}`), verify()),
      };
      p.lines.push(line);
      return line;
    };
    const rowOf = (p, line, b) => ({ program: p, line, job: line.job, branch: b, owner: p, carried: undefined });

    it("a request whose sampling failed fails once and takes nothing; another owner's failed commit is its own", async () => {
      const programs = new Programs({ cache: null, store: null });
      const request = program();
      const other = program();
      const broken = program();
      const r1 = lineOf(request, 'r.0');
      const r2 = lineOf(request, 'r.1');
      const o = lineOf(other, 'o');
      const b = lineOf(broken, 'b');
      const rows = [
        rowOf(request, r1, branch(1, 'produce')),
        rowOf(request, r2, branch(2)),
        rowOf(other, o, branch(3)),
        rowOf(broken, b, branch(66, 'commit')),
      ];
      const out = await programs.decode(store, rows, null);
      assert.deepEqual(request.failures, [['r.0', 'grammar 1']]);
      assert.deepEqual([r1.heard, r2.heard], [[], []]);
      assert.deepEqual(o.heard, ['take 3', 'committed 3']);
      assert.deepEqual(broken.failures, [['b', 'commit 66']]);
      assert.deepEqual(b.heard, ['take 66']);
      assert.equal(out.committed, 2);
    });

    it('speculating: a line that throws while taking its accepted draft fails alone; the others are told', async () => {
      const programs = new Programs({ cache: null, store: null });
      const cost = new StepCost();
      const drafter = { draft: async (token, k) => Array.from({ length: k }, (_, i) => token * 10 + i) };
      const speculating = program();
      const plain = program();
      const s = lineOf(speculating, 's', {
        drafter,
        verify: () => {
          throw new Error('the draft model cannot follow');
        },
      });
      s.job.draftLength = new DraftLength({ maxDraft: 2, cost, adaptive: false });
      const p = lineOf(plain, 'p');
      const spec = { ctx: { nOutputs: 16, nBatch: 16 }, spec: { source: {}, cost } };
      const out = await programs.decode(store, [rowOf(speculating, s, branch(1)), rowOf(plain, p, branch(2))], spec);
      assert.deepEqual(s.heard, ['take 1', 'committed 1', 'verified 1']);
      assert.deepEqual(speculating.failures, [['s', 'the draft model cannot follow']]);
      assert.deepEqual(p.heard, ['take 2', 'committed 2'], 'a row without a draft hears no verification');
      assert.deepEqual([out.committed, out.drafted, out.accepted], [2, 2, 1]);
      assert.ok(cost.n > 0, 'the step was timed');
    });
  });

  describe('schedulerOptions', () => {
    const ctx = {}; // read only to check a draft model's vocabulary

    it('fills in the defaults', () => {
      const o = schedulerOptions(ctx, {});
      assert.deepEqual(o, {
        prefillChunk: 256,
        maxQueue: 64,
        maxRunning: Infinity,
        defaultMaxTokens: 256,
        onStep: null,
        spec: null,
        tiers: null,
        parseSpecial: false,
        stepBudgetMs: null,
      });
      assert.equal(schedulerOptions(ctx, { maxQueue: 0 }).maxQueue, 0, 'maxQueue 0: nothing may wait');
      assert.equal(schedulerOptions(ctx, { stepBudgetMs: 40 }).stepBudgetMs, 40);
      for (const stepBudgetMs of [0, -1, Infinity, '40', NaN])
        assert.throws(() => schedulerOptions(ctx, { stepBudgetMs }), {
          code: 'ERR_INVALID_ARG',
          message: /stepBudgetMs/,
        });
      assert.equal(schedulerOptions(ctx, { parseSpecial: true }).parseSpecial, true);
      assert.throws(() => schedulerOptions(ctx, { parseSpecial: 'yes' }), {
        code: 'ERR_INVALID_ARG',
        message: /parseSpecial/,
      });
    });

    it('reads cache sizes in bytes or with units, and turns the tiers on with RAM or a folder', () => {
      assert.equal(parseBytes('2GiB', 'x'), 2 * 1024 ** 3);
      assert.equal(parseBytes('500MB', 'x'), 5e8);
      assert.equal(parseBytes('1.5k', 'x'), 1500);
      assert.equal(parseBytes(4096, 'x'), 4096);
      const warn = () => {};
      assert.deepEqual(schedulerOptions(ctx, { cacheRam: '1MiB', onCacheWarning: warn }).tiers, {
        ramBytes: 1048576,
        dir: null,
        diskBytes: 20 * 1024 ** 3,
        warn,
      });
      assert.equal(schedulerOptions(ctx, { cacheDir: '/tmp/c', cacheDisk: '1GB' }).tiers.diskBytes, 1e9);
    });

    it('refuses bad values with coded errors that name the option', () => {
      const bad = [
        [{ prefillChunk: 0 }, /options.prefillChunk/],
        [{ maxQueue: -1 }, /options.maxQueue/],
        [{ maxRunning: 1.5 }, /options.maxRunning/],
        [{ defaultMaxTokens: '8' }, /options.defaultMaxTokens/],
        [{ onStep: 1 }, /options.onStep/],
        [{ cacheRam: '2 potatoes' }, /options.cacheRam must be a size/],
        [{ cacheRam: -1 }, /options.cacheRam/],
        [{ cacheDir: 7 }, /options.cacheDir must be a folder/],
        [{ cacheDir: '/tmp/x', cacheDisk: {} }, /options.cacheDisk/],
        [{ cacheRam: 1, onCacheWarning: 'log' }, /options.onCacheWarning/],
        [{ speculative: { lookup: true, draft: {} } }, /exactly one of lookup, draft or source/],
      ];
      for (const [options, message] of bad)
        assert.throws(
          () => schedulerOptions(ctx, options),
          (e) => e.code === 'ERR_INVALID_ARG' && message.test(e.message),
          JSON.stringify(options),
        );
    });

    it('speculation gets the step-cost fit every request shares', () => {
      const { spec } = schedulerOptions(ctx, { speculative: { lookup: true, maxDraft: 4 } });
      assert.equal(spec.maxDraft, 4);
      assert.equal(typeof spec.source.open, 'function');
      assert.ok(spec.cost instanceof StepCost);
      const again = schedulerOptions(ctx, { speculative: { lookup: { ngramMax: 3 } } });
      assert.equal(again.spec.cost, spec.cost, 'lookup on one context: one fit, whichever scheduler');
      assert.notEqual(schedulerOptions({}, { speculative: { lookup: true } }).spec.cost, spec.cost);
    });
  });

  describe('StepBudget: extra lines admitted while the predicted step fits the budget', () => {
    const { StepBudget } = require('../../lib/scheduler/step-budget');

    it('no budget admits everything and fits nothing', () => {
      const b = new StepBudget(null);
      b.observe(4, 400);
      assert.equal(b.predict(4), 0);
      assert.equal(b.admits(100), true);
      assert.equal(b.deferred, 0);
    });

    it('predicts from rows: per-row mean until steps vary, then the fitted line', () => {
      const b = new StepBudget(50);
      assert.equal(b.predict(3), 0, 'before any step: eager');
      b.observe(2, 60);
      assert.equal(b.predict(4), 120, 'one size seen: 30 ms a row');
      for (let i = 0; i < 40; i++) b.observe(1 + (i % 4), 20 + 10 * (1 + (i % 4))); // 20 + 10·rows
      assert.ok(Math.abs(b.predict(8) - 100) < 3, `fitted ${b.predict(8)}`);
    });

    it('admits while rows + 1 fit, always beside no rows, and counts what it held back per round', () => {
      const b = new StepBudget(55);
      for (let i = 0; i < 40; i++) b.observe(1 + (i % 4), 20 + 10 * (1 + (i % 4)));
      b.admitting();
      assert.equal(b.admits(2), true, '3 rows: 50 ms');
      assert.equal(b.admits(3), false, '4 rows: 60 ms');
      assert.equal(b.admits(0), true, 'a step without rows takes one whatever the budget');
      assert.equal(new StepBudget(0.001).admits(0), true);
      assert.equal(b.deferred, 1);
      b.admitting();
      assert.equal(b.deferred, 0);
    });
  });

  describe('DraftLength and StepCost: drafting turns itself off where a row costs a step', () => {
    /** A fit that has seen plain steps of `base` ms and steps of 1 + k rows at `perRow` more each. */
    const fitted = (base, perRow) => {
      const cost = new StepCost();
      for (let i = 0; i < 20; i++) cost.observe(1 + (i % 4), base + perRow * (i % 4));
      return cost;
    };

    it('a row cheaper than a step drafts at high acceptance; a row as dear as a step never pays', () => {
      const cheap = fitted(75, 20);
      assert.ok(new DraftLength({ maxDraft: 4, cost: cheap }).next(8) > 0);
      const dear = fitted(75, 84); // the 1.5B's verified row plus the 0.5B's draft token, 2 cores
      const length = new DraftLength({ maxDraft: 4, cost: dear });
      assert.equal(length.best(4, 0.99, dear.ratio()), 0, 'not even drafts always accepted');
      assert.equal(length.next(8), 0);
    });

    it("a draft model must promise 10 % (its catch-up prefill is not in the steps' time); lookup any gain", () => {
      const cost = fitted(75, 66); // r = 0.88: always-accepted drafts of 4 would give 1.09x
      const draft = new DraftLength({ maxDraft: 4, cost, source: { kind: 'draft' } });
      const lookup = new DraftLength({ maxDraft: 4, cost, source: { kind: 'lookup' } });
      assert.deepEqual([draft.minGain, lookup.minGain], [1.1, 1]);
      assert.equal(draft.best(4, 0.99, cost.ratio()), 0);
      assert.equal(lookup.best(4, 0.99, cost.ratio()), 4);
    });

    it('where drafting cannot pay lines stop probing on their own: one probe per ever longer wait, shared', () => {
      const cost = fitted(75, 84);
      const lines = Array.from({ length: 4 }, () => new DraftLength({ maxDraft: 4, cost }));
      let probes = 0;
      for (let step = 0; step < 64 * 7; step++) for (const l of lines) if (l.next(8) > 0) probes++;
      // 1792 row-steps: probes at the 64th, 192nd, 448th and 960th (waits of 64, 128, 256, 512)
      assert.equal(probes, 4);
      assert.equal(new DraftLength({ maxDraft: 4, cost, adaptive: false }).next(8), 4, 'fixed length drafts');
    });
  });

  describe('SchedulerEvents.step', () => {
    it('sends an evict event only for evictions since the last step event, then the gauges', () => {
      const events = new SchedulerEvents();
      const seen = [];
      events.subscribe((e) => seen.push(e));
      const stats = { steps: 3, running: 2, programs: 1, queued: 4, cellsUsed: 50, nCtx: 512 };
      const cache = { cachedPrefixes: 2, hitRate: 2 / 3, evictions: 2 };
      const gauges = { leasesUsed: 5, nSeqMax: 16, cacheTokens: 40 };
      events.step({ rows: 7, prefillTokens: 9, stepMs: 1.23456 }, { ...stats, ...cache }, gauges);
      events.step({ rows: 1, prefillTokens: 0, stepMs: 1 }, { ...stats, ...cache }, gauges);
      assert.deepEqual(
        seen.map((e) => e.event),
        ['evict', 'step', 'step'],
      );
      assert.equal(seen[0].entries, 2);
      const { t, ...step } = seen[1];
      assert.equal(typeof t, 'number');
      assert.deepEqual(step, {
        event: 'step',
        step: 3,
        rows: 7,
        prefillTokens: 9,
        stepMs: 1.23,
        running: 3,
        queued: 4,
        cellsUsed: 50,
        nCtx: 512,
        leasesUsed: 5,
        nSeqMax: 16,
        cache: { entries: 2, tokens: 40, hitRate: 0.667, evictions: 2 },
      });
    });
  });
});
