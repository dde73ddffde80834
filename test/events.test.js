'use strict';

// The event stream of the branch trees (docs/events.md): Scheduler.subscribe on a real model,
// ctx.trace for scripts, and `llama-branch serve`'s GET /v1/events, --trace and page routes on a
// real server process. The page itself is tested in a real browser by `npm run test:ui`.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Scheduler, Branch, BranchStore } = require('..');
const { open } = require('./helpers');
const { startServer, stopServer, readEvents } = require('./serve-helpers');

const byType = (events, type) => events.filter((e) => e.event === type);

/** Every branch named by an event was forked first, each once, and its tokens' counts grow. */
function checkTree(events) {
  const forked = new Map();
  for (const e of events) {
    assert.equal(typeof e.t, 'number', `${e.event} has a time`);
    if (e.event === 'fork') {
      assert.ok(!forked.has(e.branch), `${e.branch} forked once`);
      if (e.parent !== null) assert.ok(forked.has(e.parent), `${e.branch}'s parent ${e.parent} came first`);
      forked.set(e.branch, e.at);
    } else if (e.branch !== undefined) {
      assert.ok(forked.has(e.branch), `${e.event} of ${e.branch} after its fork`);
      if (e.n !== undefined) assert.ok(e.n >= forked.get(e.branch), `${e.branch}'s n never below its fork point`);
    }
  }
  return forked;
}

describe('branch tree events', function () {
  this.timeout(180000);

  describe('Scheduler.subscribe', () => {
    let ctx;
    let scheduler;
    before(async () => {
      ctx = await open({ nCtx: 2048, nSeqMax: 16 });
      scheduler = new Scheduler(ctx);
    });
    after(async () => {
      await scheduler.close();
      ctx.dispose();
    });

    it('a request with n = 3: admit, its prompt and three forks, tokens, finishes, done', async () => {
      const events = [];
      const stop = scheduler.subscribe((e) => events.push(e));
      const result = await scheduler.generate({ prompt: 'The capital of France is', n: 3, maxTokens: 6, seed: 7 });
      stop();
      const admit = byType(events, 'admit');
      assert.equal(admit.length, 1);
      const id = admit[0].request;
      assert.match(id, /^r\d+$/);
      assert.equal(admit[0].n, 3);
      const forked = checkTree(events);
      assert.deepEqual([...forked.keys()], [id, `${id}.0`, `${id}.1`, `${id}.2`]);
      const prompt = admit[0].promptTokens;
      for (let i = 0; i < 3; i++) {
        const branch = `${id}.${i}`;
        const fork = events.find((e) => e.event === 'fork' && e.branch === branch);
        assert.equal(fork.parent, id);
        assert.equal(fork.at, prompt, 'the choices share the whole prompt');
        const tokens = events.filter((e) => e.event === 'token' && e.branch === branch);
        assert.equal(tokens.map((e) => e.text).join(''), result.choices[i].text, 'the tokens add up to the text');
        const finish = events.find((e) => e.event === 'finish' && e.branch === branch);
        assert.equal(finish.reason, result.choices[i].finishReason);
        assert.equal(finish.n, prompt + result.choices[i].tokens.length);
      }
      assert.equal(events.find((e) => e.event === 'append' && e.branch === id).text, 'The capital of France is');
      const done = byType(events, 'done');
      assert.deepEqual(
        done.map((e) => [e.request, e.status]),
        [[id, 'ok']],
      );
      const steps = byType(events, 'step');
      assert.ok(steps.length >= 6, `${steps.length} steps`);
      for (const s of steps) {
        assert.ok(s.cellsUsed > 0 && s.cellsUsed <= s.nCtx);
        assert.ok(s.leasesUsed >= 1 && s.leasesUsed <= s.nSeqMax);
        assert.equal(typeof s.cache.entries, 'number');
      }
      assert.ok(
        steps.some((s) => s.rows === 3),
        'a decode with all three choices',
      );
    });

    it('a program: forked lines, a released one pruned, gens finished, done', async () => {
      const events = [];
      const stop = scheduler.subscribe((e) => events.push(e));
      await scheduler.run(async (line) => {
        line.append('A list of fruits:');
        const [a, b] = line.fork(2);
        await Promise.all([a.gen({ maxTokens: 3 }), b.gen({ maxTokens: 3 })]);
        b.release();
        return a.text;
      });
      stop();
      const [admit] = byType(events, 'admit');
      assert.equal(admit.kind, 'program');
      const forked = checkTree(events);
      assert.equal(forked.size, 3, 'the root line and two forks');
      const [root, a, b] = [...forked.keys()];
      assert.deepEqual(
        byType(events, 'prune').map((e) => e.branch),
        [b],
      );
      assert.deepEqual(
        byType(events, 'finish')
          .map((e) => e.branch)
          .sort(),
        [a, b].sort(),
      );
      assert.equal(events.find((e) => e.event === 'fork' && e.branch === a).parent, root);
      assert.equal(byType(events, 'done')[0].status, 'ok');
    });

    it('drops a listener that throws; the request goes on', async () => {
      const stop = scheduler.subscribe(() => {
        throw new Error('observer bug');
      });
      const warned = new Promise((resolve) => {
        const onWarning = (w) => {
          if (!/Scheduler event listener threw/.test(w.message)) return;
          process.off('warning', onWarning);
          resolve(w);
        };
        process.on('warning', onWarning);
      });
      const r = await scheduler.generate({ prompt: 'Hello', maxTokens: 2 });
      assert.equal(r.choices.length, 1, 'the request is unaffected');
      assert.match((await warned).message, /listener threw/);
      stop();
      assert.throws(
        () => scheduler.subscribe('nope'),
        (e) => e.code === 'ERR_INVALID_ARG',
      );
    });
  });

  describe('ctx.trace (scripts)', () => {
    it('reports forks, prefill, commits, finish and prunes with its own ids', async () => {
      const ctx = await open({ nSeqMax: 4 });
      try {
        const events = [];
        const trace = ctx.trace((e) => events.push(e));
        const store = new BranchStore(ctx);
        const root = Branch.create(ctx, 0, { temperature: 0 });
        await root.prefill(await ctx.tokenize('One, two,'));
        const [x, y] = [root.fork(), root.fork()];
        for (let i = 0; i < 3; i++) await store.commit([x, y].map((b) => [b, b.produce().token]));
        trace.finish(x, 'best');
        await y.prune();
        trace.stop();
        await x.prune(); // after stop: not reported
        assert.equal(events[0].event, 'hello');
        assert.equal(events[0].source, 'script');
        const forked = checkTree(events.slice(1));
        assert.deepEqual([...forked.keys()], ['b1', 'b2', 'b3']);
        assert.equal(trace.idOf(y), 'b3');
        const append = byType(events, 'append')[0];
        assert.equal(append.branch, 'b1');
        assert.match(append.text, /One, two,/);
        assert.equal(events.find((e) => e.branch === 'b2' && e.event === 'fork').at, append.n);
        assert.equal(byType(events, 'token').length, 6);
        assert.deepEqual(
          byType(events, 'finish').map((e) => [e.branch, e.reason]),
          [['b2', 'best']],
        );
        assert.deepEqual(
          byType(events, 'prune').map((e) => e.branch),
          ['b3'],
        );
        await root.prune();
      } finally {
        ctx.dispose();
      }
    });
  });

  describe('llama-branch serve: GET /v1/events, --trace, the page routes', () => {
    let server;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-events-'));
    const traceFile = path.join(dir, 'trace.jsonl');
    const KEY = 'sk-events-test';
    const auth = { authorization: `Bearer ${KEY}` };
    before(async () => {
      server = await startServer([
        '--parallel',
        '2',
        '--ctx-size',
        '2048',
        '--threads',
        '2',
        '--api-key',
        KEY,
        '--trace',
        traceFile,
      ]);
    });
    after(async () => {
      if (server) assert.equal(await stopServer(server.child), 0, server.stderr());
      fs.rmSync(dir, { recursive: true, force: true });
    });

    const complete = (body) =>
      fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { ...auth, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }).then((r) => r.json());

    it('serves the page without a key; the events need one', async () => {
      const page = await fetch(`${server.url}/`);
      assert.equal(page.status, 200);
      assert.match(page.headers.get('content-type'), /text\/html/);
      assert.match(await page.text(), /<script src="\/ui\/app\.js"/);
      for (const asset of ['/ui/app.js', '/ui/style.css']) assert.equal((await fetch(server.url + asset)).status, 200);
      const refused = await fetch(`${server.url}/v1/events`);
      assert.equal(refused.status, 401);
      assert.equal((await refused.json()).error.code, 'invalid_api_key');
    });

    it('streams a request live, then replays it to a late client with tokens merged', async () => {
      let result;
      const live = await readEvents(server.url, {
        key: KEY,
        onOpen: async () => {
          result = await complete({ prompt: 'Once upon a time', n: 2, max_tokens: 5, temperature: 0.8, seed: 3 });
        },
        until: (events) => events.some((e) => e.event === 'done'),
      });
      assert.equal(live[0].event, 'hello');
      assert.equal(live[0].source, 'server');
      const request = byType(live, 'admit')[0].request;
      const mine = live.filter((e) => e.request === request);
      checkTree(mine);
      assert.equal(byType(mine, 'fork').length, 3);
      assert.equal(byType(mine, 'finish').length, 2);
      assert.ok(byType(mine, 'token').length >= 2);
      await new Promise((resolve) => setTimeout(resolve, 100));
      while (!result) await new Promise((resolve) => setTimeout(resolve, 20));

      const late = await readEvents(server.url, {
        key: KEY,
        until: (events) => events.some((e) => e.event === 'done' && e.request === request),
      });
      const replayed = late.filter((e) => e.request === request);
      checkTree(replayed);
      for (let i = 0; i < 2; i++) {
        const tokens = replayed.filter((e) => e.event === 'token' && e.branch === `${request}.${i}`);
        assert.equal(tokens.length, 1, "a branch's tokens come merged into one event");
        assert.equal(tokens[0].text, result.choices[i].text);
      }
      assert.ok(byType(late, 'step').length > 0, 'the last minute of steps is replayed');
    });

    it('--trace writes the same events as JSONL', async () => {
      const lines = fs
        .readFileSync(traceFile, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      assert.equal(lines[0].event, 'hello');
      const done = byType(lines, 'done');
      assert.ok(done.length >= 1);
      checkTree(lines.filter((e) => e.request === done[0].request));
    });
  });

  it('--no-ui: no page at /, the events stay', async () => {
    const server = await startServer(['--no-ui', '--threads', '2', '--ctx-size', '1024']);
    try {
      assert.equal((await fetch(`${server.url}/`)).status, 404);
      const events = await readEvents(server.url, { until: (e) => e.length > 0 });
      assert.equal(events[0].event, 'hello');
    } finally {
      assert.equal(await stopServer(server.child), 0);
    }
  });
});
