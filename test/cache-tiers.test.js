'use strict';

// The prefix cache's RAM and disk tiers (lib/scheduler/prefix-cache.js) on the real model: an
// evicted prefix restored instead of prefilled, a restart finding the folder's files, and the
// faults: corrupted and truncated files, a state from other KV settings, a folder that cannot
// be written or disappears, a writer killed with SIGKILL mid-spill. Prompts are short and nCtx
// small, so the KV cells hold two prompts and a third evicts.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { Scheduler, readPrefixCacheFile } = require('..');
const { open, rejects, MODEL } = require('./helpers');
const { startServer, stopServer } = require('./serve-helpers');

const N_CTX = 256;
/** Four prompts of ~110 tokens: two fit the KV cells, the others evict. */
const PROMPTS = ['apples', 'rivers', 'engines', 'castles'].map(
  (topic) =>
    `Here is a long note about ${topic}. ` +
    `It talks about ${topic} in detail, one sentence after another, so that the prompt is long. `.repeat(5) +
    `Question: what is the single most important fact about ${topic}? Answer:`,
);

function tempDir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'lb-tiers-'));
}

const mount = (...args) => spawnSync('mount', args, { encoding: 'utf8' });

/**
 * Why this process may not mount a tmpfs (not root, or a container without mount rights), or null
 * when it may: the tests that need a mount say in their titles why they do not run.
 */
function mountRefusal() {
  const dir = tempDir();
  try {
    const r = mount('-t', 'tmpfs', '-o', 'size=4k', 'tmpfs', dir);
    if (r.status === 0) return spawnSync('umount', [dir]).status === 0 ? null : 'umount failed';
    return `mount refused: ${(r.stderr || (r.error && r.error.message) || `exit ${r.status}`).trim().split('\n')[0]}`;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
const MOUNT_REFUSED = mountRefusal();
const IS_ROOT = Boolean(process.getuid && process.getuid() === 0);
/** How the tests make a folder that cannot be written (as root, permissions do not bind). */
const READ_ONLY = MOUNT_REFUSED === null ? 'mount' : IS_ROOT ? 'file' : 'chmod';

function cacheFiles(dir) {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.lbkv'));
}

/** One greedy answer with the top-3 alternatives of its first token. */
async function ask(scheduler, prompt) {
  const r = await scheduler.generate({ prompt, maxTokens: 1, params: { temperature: 0 }, logprobs: 3 });
  const first = r.choices[0].logprobs[0];
  return { usage: r.usage, first: first.token, top: first.top.map((t) => t.token) };
}

describe('prefix cache tiers (RAM and disk)', function () {
  this.timeout(240000);
  let ctx;
  const warnings = [];
  const onCacheWarning = (m) => warnings.push(m);
  const cold = [];
  /** Every scheduler a test opens: closed after it, whatever happened (they share ctx's cells). */
  let opened = [];
  const scheduler = (c, options) => {
    const s = new Scheduler(c, options);
    opened.push(s);
    return s;
  };
  afterEach(async () => {
    for (const s of opened) await s.close();
    opened = [];
  });

  before(async () => {
    ctx = await open({ nCtx: N_CTX, nSeqMax: 8 });
    // Cold answers, each prompt prefilled whole on a KV-only scheduler.
    const s = new Scheduler(ctx);
    for (const p of PROMPTS) cold.push(await ask(s, p));
    await s.close();
  });
  after(() => ctx && ctx.dispose());
  beforeEach(() => (warnings.length = 0));

  it('restores evicted prefixes from RAM and disk instead of prefilling them; the answers agree', async () => {
    const dir = tempDir();
    // RAM for about one prompt's state: the other evicted prefixes go to disk.
    const s = scheduler(ctx, { cacheRam: '2.5MB', cacheDir: dir, onCacheWarning });
    for (const p of PROMPTS) await ask(s, p);
    const first = s.stats();
    assert.ok(first.evictions >= 2, `the KV cells should have evicted (evictions ${first.evictions})`);
    // Most recent first: two in the KV cells, the next in RAM, the oldest on disk.
    for (let i = PROMPTS.length - 1; i >= 0; i--) {
      const again = await ask(s, PROMPTS[i]);
      assert.ok(again.usage.cachedPromptTokens > 0, `prompt ${i} should start from a cached prefix`);
      // CPU decodes are not batch-invariant: compare top-k, not exact logits.
      assert.ok(cold[i].top.includes(again.first), `prompt ${i}: ${again.first} not in the cold top 3 ${cold[i].top}`);
    }
    const t = /** @type {any} */ (s.stats().cacheTiers);
    assert.ok(t.ramHits >= 1, `RAM hits ${t.ramHits}`);
    assert.ok(t.diskHits >= 1, `disk hits ${t.diskHits}`);
    assert.ok(t.restoredTokens >= 2 * 100, `restored tokens ${t.restoredTokens}`);
    assert.ok(t.ramBytes <= 2.5e6, `RAM tier over budget: ${t.ramBytes}`);
    assert.equal(t.diskOn, true);
    const prefilled = s.stats().prefilledTokens - first.prefilledTokens;
    assert.ok(prefilled < 4 * 40, `second round prefilled ${prefilled} tokens, expected a few per prompt`);
    assert.deepEqual(warnings, []);
    await s.close();
    assert.ok(cacheFiles(dir).length >= PROMPTS.length, 'close() writes every cached prefix to the folder');
    assert.deepEqual(
      fs.readdirSync(dir).filter((f) => f.endsWith('.tmp')),
      [],
      'no temporary file is left behind',
    );

    // A restart: a new scheduler on the folder loads the files on demand.
    const again = scheduler(ctx, { cacheDir: dir, onCacheWarning });
    const r = await ask(again, PROMPTS[2]);
    assert.ok(r.usage.cachedPromptTokens >= r.usage.promptTokens - 1, JSON.stringify(r.usage));
    assert.ok(cold[2].top.includes(r.first));
    assert.equal(/** @type {any} */ (again.stats().cacheTiers).diskHits, 1);
    await again.close();
    assert.deepEqual(warnings, []);

    // The library reads a file back, and names a foreign one.
    const file = path.join(dir, cacheFiles(dir)[0]);
    const read = await readPrefixCacheFile(ctx, file);
    assert.ok(read.tokens.length >= 16 && read.stateBytes > 0);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("restores a program's evicted first text (a decision's state) from RAM instead of prefilling it", async () => {
    const s = scheduler(ctx, { cacheRam: '64MB', onCacheWarning });
    const ids = ctx.tokenizeSync(' the a is', false);
    // A program reads the logits after its text; maxCells leaves room for a restored entry beside it.
    const peek = (prompt) =>
      s.run(
        async (line) => {
          line.append(prompt);
          return line.logprobs(ids);
        },
        { maxCells: 128 },
      );
    const first = await peek(PROMPTS[0]); // prefilled whole; the line's text becomes a cache entry
    for (const p of PROMPTS.slice(1, 3)) await ask(s, p); // the KV cells hold two: PROMPTS[0] goes to RAM
    const tiers = () => /** @type {any} */ (s.stats().cacheTiers);
    const ramHits = tiers().ramHits;
    const before = s.stats().prefilledTokens;
    const again = await peek(PROMPTS[0]);
    assert.equal(tiers().ramHits, ramHits + 1, 'the line started from the RAM tier');
    const prefilled = s.stats().prefilledTokens - before;
    assert.ok(prefilled <= 2, `prefilled ${prefilled}: only the last token again (a state holds no logits)`);
    // The same logits after the text, up to the last token decoded again in another batch shape
    // (llama.cpp on a CPU is not batch-invariant: a tolerance, and the same order of the tokens).
    again.forEach((lp, i) => assert.ok(Math.abs(lp - first[i]) < 0.25, `token ${ids[i]}: ${lp} vs ${first[i]}`));
    const order = (lps) => ids.map((_, i) => i).sort((a, b) => lps[b] - lps[a]);
    assert.deepEqual(order(again), order(first));
    assert.deepEqual(warnings, []);
  });

  it("two schedulers on one folder use each other's files", async () => {
    const dir = tempDir();
    const ctx2 = await open({ nCtx: N_CTX, nSeqMax: 8 });
    try {
      // B runs first, on an empty folder; A then caches a prompt and writes it there on close.
      const b = scheduler(ctx2, { cacheDir: dir, onCacheWarning });
      await ask(b, PROMPTS[0]);
      const a = scheduler(ctx, { cacheDir: dir, onCacheWarning });
      await ask(a, PROMPTS[1]);
      await a.close();
      await new Promise((r) => setTimeout(r, 1100)); // B lists the folder again at most once a second
      const r = await ask(b, PROMPTS[1]);
      assert.ok(r.usage.cachedPromptTokens >= r.usage.promptTokens - 1, JSON.stringify(r.usage));
      assert.ok(cold[1].top.includes(r.first));
      assert.equal(/** @type {any} */ (b.stats().cacheTiers).diskHits, 1);
      await b.close();
      assert.deepEqual(warnings, []);
    } finally {
      ctx2.dispose();
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('skips corrupted, truncated and foreign files with a warning, and serves those prompts by prefill', async () => {
    const dir = tempDir();
    const s = scheduler(ctx, { cacheDir: dir, onCacheWarning });
    for (const p of PROMPTS.slice(0, 3)) await ask(s, p);
    await s.close();
    const files = cacheFiles(dir).map((f) => path.join(dir, f));
    assert.ok(files.length >= 3);
    // One byte flipped inside the state, one file cut short, one file of garbage.
    const bytes = fs.readFileSync(files[0]);
    bytes[Math.floor(bytes.length / 2)] ^= 0xff;
    fs.writeFileSync(files[0], bytes);
    fs.truncateSync(files[1], Math.floor(fs.statSync(files[1]).size / 3));
    fs.writeFileSync(path.join(dir, `${'0'.repeat(40)}.lbkv`), 'not a cache file at all');
    // A file of the format before the saved-state container ('LBKV', version 1): foreign now.
    const old = Buffer.alloc(200);
    old.write('LBKV');
    old.writeUInt32LE(1, 4);
    fs.writeFileSync(path.join(dir, `${'1'.repeat(40)}.lbkv`), old);
    await rejects(() => readPrefixCacheFile(ctx, files[0]), 'ERR_STATE_CORRUPT', /checksum/);
    await rejects(() => readPrefixCacheFile(ctx, files[1]), 'ERR_STATE_CORRUPT');

    const again = scheduler(ctx, { cacheDir: dir, onCacheWarning });
    for (let i = 0; i < 3; i++) {
      const r = await ask(again, PROMPTS[i]);
      assert.ok(cold[i].top.includes(r.first), `prompt ${i} answered from a bad file?`);
    }
    const t = /** @type {any} */ (again.stats().cacheTiers);
    assert.ok(t.skipped >= 3, `skipped ${t.skipped}; warnings: ${warnings.join(' | ')}`);
    assert.ok(
      warnings.some((w) => w.includes('1'.repeat(40)) && /older version/.test(w)),
      warnings.join(' | '),
    );
    assert.ok(t.diskHits <= 1, 'only the intact file can be a hit');
    assert.ok(
      warnings.some((w) => /checksum|truncated|not a usable/.test(w)),
      warnings.join(' | '),
    );
    // The corrupted file was removed; the prompt, prefilled and evicted again, may have a good one now.
    if (fs.existsSync(files[0])) await readPrefixCacheFile(ctx, files[0]);
    await again.close();

    // A context with other KV settings (typeK q8_0) shares no state with these files.
    const other = await open({ nCtx: N_CTX, nSeqMax: 8, typeK: 'q8_0' });
    try {
      await rejects(() => readPrefixCacheFile(other, files[2]), 'ERR_STATE_MISMATCH', /typeK=q8_0/);
      const foreign = scheduler(other, { cacheDir: dir, onCacheWarning });
      warnings.length = 0;
      const r = await foreign.generate({ prompt: PROMPTS[2], maxTokens: 2, params: { temperature: 0 } });
      assert.equal(r.usage.cachedPromptTokens, 0, 'a foreign state is never loaded');
      assert.ok(
        warnings.some((w) => /typeK=q8_0/.test(w)),
        warnings.join(' | '),
      );
      await foreign.close();
    } finally {
      other.dispose();
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const readOnlyHow = {
    mount: 'a tmpfs mounted read-only',
    chmod: 'a folder without write permission',
    file: `a file in the folder's place: as root, permissions do not bind, and ${MOUNT_REFUSED}`,
  }[READ_ONLY];
  it(`turns the disk tier off with a warning when the folder cannot be written (${readOnlyHow}) or disappears`, async () => {
    const base = tempDir();
    let dir = path.join(base, 'ro');
    if (READ_ONLY === 'file') {
      fs.writeFileSync(dir, 'a file where the folder should be');
      dir = path.join(dir, 'cache');
    } else {
      fs.mkdirSync(dir);
      if (READ_ONLY === 'mount') assert.equal(mount('-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', dir).status, 0);
      else fs.chmodSync(dir, 0o555);
    }
    try {
      const s = scheduler(ctx, { cacheRam: '1MB', cacheDir: dir, onCacheWarning });
      for (const p of PROMPTS.slice(0, 3)) await ask(s, p); // the third evicts the first
      const r = await ask(s, PROMPTS[0]);
      assert.ok(cold[0].top.includes(r.first));
      assert.equal(/** @type {any} */ (s.stats().cacheTiers).diskOn, false);
      assert.ok(
        warnings.some((w) => /disk tier is off/.test(w)),
        warnings.join(' | '),
      );
      if (READ_ONLY === 'mount')
        assert.ok(
          warnings.some((w) => /EROFS|read-only/i.test(w)),
          warnings.join(' | '),
        );
      await s.close();
    } finally {
      if (READ_ONLY === 'mount') spawnSync('umount', [dir]);
    }

    // Deleted while serving: the writes after it fail, RAM goes on.
    warnings.length = 0;
    const gone = tempDir();
    const s2 = scheduler(ctx, { cacheRam: '1MB', cacheDir: gone, onCacheWarning });
    await ask(s2, PROMPTS[0]);
    fs.rmSync(gone, { recursive: true, force: true });
    for (const p of PROMPTS.slice(1, 3)) await ask(s2, p); // the third evicts the first
    const r2 = await ask(s2, PROMPTS[0]);
    assert.ok(cold[0].top.includes(r2.first));
    await s2.close();
    assert.equal(/** @type {any} */ (s2.stats().cacheTiers).diskOn, false);
    assert.ok(
      warnings.some((w) => /disk tier is off/.test(w)),
      warnings.join(' | '),
    );
    fs.rmSync(base, { recursive: true, force: true });
  });

  /**
   * `it` for a test that needs mount rights. Where mounting is refused (not root, or a container
   * without mount rights: the cases above still ran) a test whose title says so, checking that it
   * is, so that a machine that may mount runs the real test.
   */
  const itMounting = (title, fn) =>
    MOUNT_REFUSED === null
      ? it(title, fn)
      : it(`${title}: not run here, ${MOUNT_REFUSED}`, () => assert.notEqual(mountRefusal(), null));

  itMounting('a full disk and a read-only mount turn the disk tier off (a 1 MiB tmpfs)', async function () {
    const mnt = tempDir();
    assert.equal(mount('-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', mnt).status, 0);
    try {
      // Full: a state (about 2 MB) does not fit in 1 MiB.
      const full = scheduler(ctx, { cacheRam: '1MB', cacheDir: mnt, onCacheWarning });
      for (const p of PROMPTS.slice(0, 3)) await ask(full, p);
      assert.ok(cold[0].top.includes((await ask(full, PROMPTS[0])).first));
      await full.close(); // (waits for the writes in flight)
      assert.equal(/** @type {any} */ (full.stats().cacheTiers).diskOn, false);
      assert.ok(
        warnings.some((w) => /disk tier is off.*(ENOSPC|no space)/i.test(w)),
        warnings.join(' | '),
      );
      assert.deepEqual(fs.readdirSync(mnt), [], 'the partial temporary file is removed');
      // Read-only: the same mount, remounted read-only.
      warnings.length = 0;
      assert.equal(mount('-o', 'remount,ro', mnt).status, 0);
      const ro = scheduler(ctx, { cacheRam: '1MB', cacheDir: mnt, onCacheWarning });
      for (const p of PROMPTS.slice(0, 3)) await ask(ro, p);
      await ro.close();
      assert.equal(/** @type {any} */ (ro.stats().cacheTiers).diskOn, false);
      assert.ok(
        warnings.some((w) => /disk tier is off.*(EROFS|read-only)/i.test(w)),
        warnings.join(' | '),
      );
    } finally {
      spawnSync('umount', [mnt]);
      fs.rmSync(mnt, { recursive: true, force: true });
    }
  });

  it('a writer killed with SIGKILL mid-spill leaves the folder usable and its finished files restorable', async () => {
    const dir = tempDir();
    // A child process spills every evicted prefix straight to disk, and is killed once its first
    // cache file is complete, while it writes the next one if we catch it (a temporary file).
    const temporary = () => fs.readdirSync(dir).some((f) => f.endsWith('.tmp'));
    const script = `
      const { createContext, Scheduler } = require(${JSON.stringify(path.join(__dirname, '..'))});
      (async () => {
        const ctx = await createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: ${N_CTX}, nSeqMax: 8, nThreads: 2 });
        const s = new Scheduler(ctx, { cacheDir: ${JSON.stringify(dir)} });
        const prompts = ${JSON.stringify(PROMPTS)};
        for (let round = 0; ; round++)
          for (const p of prompts) await s.generate({ prompt: p + ' ' + round, maxTokens: 1 });
      })();`;
    const child = spawn(process.execPath, ['-e', script], { stdio: 'ignore' });
    const deadline = Date.now() + 120000;
    while (cacheFiles(dir).length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
    const midWrite = Date.now() + 3000;
    while (!temporary() && Date.now() < midWrite) await new Promise((r) => setImmediate(r));
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    const finished = cacheFiles(dir);
    assert.ok(finished.length > 0, 'the child finished no cache file before the deadline');

    // Whatever the child left is a complete file (a rename is atomic) or an ignored temp file.
    const entries = [];
    for (const f of finished) entries.push(await readPrefixCacheFile(ctx, path.join(dir, f)));
    // A prefix the killed process finished writing is restored from its file, not prefilled
    // (asked first, while no KV cells hold any of it).
    const s = scheduler(ctx, { cacheDir: dir, onCacheWarning });
    const r = await s.generate({ tokens: entries[0].tokens, maxTokens: 1, params: { temperature: 0 } });
    assert.equal(/** @type {any} */ (s.stats().cacheTiers).diskHits, 1, `warnings: ${warnings.join(' | ')}`);
    assert.ok(r.usage.cachedPromptTokens >= entries[0].tokens.length - 1, JSON.stringify(r.usage));
    for (let i = 0; i < PROMPTS.length; i++) {
      const r = await ask(s, PROMPTS[i]);
      assert.ok(cold[i].top.includes(r.first));
    }
    await s.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
});

describe('llama-branch serve --cache-dir', function () {
  this.timeout(240000);

  it('finds its prefixes on disk after a restart, shows hits per tier in /metrics, takes prompt_cache_key', async () => {
    const dir = tempDir();
    const args = ['--ctx-size', String(N_CTX), '--parallel', '1', '--cache-ram', '8MiB', '--cache-dir', dir];
    const body = { prompt: PROMPTS[3], max_tokens: 2, temperature: 0, prompt_cache_key: 'user-42' };
    const post = (url) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }).then(async (res) => ({ status: res.status, json: await res.json() }));

    let server = await startServer(args);
    try {
      const res = await post(server.url);
      assert.equal(res.status, 200, JSON.stringify(res.json));
      const bad = await fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, prompt_cache_key: 42 }),
      });
      assert.equal(bad.status, 400);
    } finally {
      await stopServer(server.child); // SIGTERM: the cache goes to the folder on the way out
    }
    assert.ok(cacheFiles(dir).length >= 1, 'the server wrote its cached prefix on exit');

    server = await startServer(args);
    try {
      const res = await post(server.url);
      assert.equal(res.status, 200);
      assert.ok(res.json.usage.prompt_tokens_details.cached_tokens >= res.json.usage.prompt_tokens - 1);
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /llamabranch_prefix_cache_hits_total\{tier="disk"\} 1/);
      assert.match(metrics, /llamabranch_prefix_cache_bytes\{tier="disk"\} [1-9]/);
      assert.match(metrics, /llamabranch_prefix_cache_restored_tokens_total [1-9]/);
    } finally {
      await stopServer(server.child);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
