'use strict';

// The tiered prefix cache (lib/scheduler/prefix-cache.js) without a model: fake branches, fake
// state copies, and real files in a temporary folder (lib/scheduler/cache-file.js). Its policy:
// part-way forks, pins, one LRU order down the tiers (KV → RAM → disk → gone), the one victim
// rule and make-room loop, promotion back into the KV cells, the folder shared with other
// processes, and the change events a KV-event publisher listens to.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { PrefixCache, MIN_PARTIAL_REUSE } = require('../../lib/scheduler/prefix-cache');
const { Queue } = require('../../lib/scheduler/queue');
const { entryName, writeEntryFile } = require('../../lib/scheduler/cache-file');
const { makeError } = require('../../lib/errors');

const { fakeBranch, range } = require('./fakes');

/** The Scheduler's KV make-room loop (lib/scheduler/programs.js): victims leave until `fits()`; false if it never does. */
function makeRoomKv(cache, fits, keep = null) {
  while (!fits()) if (!cache.evictOne(keep)) return false;
  return true;
}

/**
 * The Scheduler's restore phase (lib/scheduler/queue.js) over ready requests starting with each
 * of `prompts` (`hinted`: their client asked to keep them warm), nothing running, room made when
 * `room`; returns how many requests were told to start without their restore.
 */
async function restoreFor(cache, prompts, room, hinted = false) {
  let unfit = 0;
  const queue = new Queue({ maxQueue: 64, maxRunning: Infinity });
  for (const tokens of prompts) {
    const needsFrom = () => ({ cells: 0, leases: 0 });
    queue.add({ state: 'ready', restoreKey: tokens, hinted, needsFrom, skipRestore: () => unfit++ });
  }
  const programs = { size: 0, makeRoom: () => room, *freshStarts() {} };
  await queue.restore(/** @type {any} */ (programs), cache);
  return unfit;
}

/**
 * A stand-in for a context's saved-state file jobs (src/napi/saved_state.rs, whose container the
 * Rust tests cover): a file is the fingerprint's id, the token count, the tokens, the state and a
 * SHA-256 of all of it, refused with the native codes (ERR_STATE_MISMATCH, ERR_STATE_CORRUPT).
 * @returns {import('../../lib/scheduler/cache-file').EntryFingerprint}
 */
function fakeFingerprint(fill) {
  const id = Buffer.alloc(32, fill);
  const HEAD = 32 + 4;
  const digest = (/** @type {Buffer} */ b) => crypto.createHash('sha256').update(b).digest();
  const parse = (/** @type {string} */ file, /** @type {Buffer} */ bytes) => {
    if (bytes.length < HEAD) throw makeError('ERR_STATE_CORRUPT', `${file} is truncated`);
    if (!bytes.subarray(0, 32).equals(id))
      throw makeError('ERR_STATE_MISMATCH', `${file} holds a state from another model or KV layout`);
    const n = bytes.readUInt32LE(32);
    return { tokens: Array.from({ length: n }, (_, i) => bytes.readInt32LE(HEAD + 4 * i)), stateAt: HEAD + 4 * n };
  };
  const native = {
    _prefixFileSize: (/** @type {number} */ n, /** @type {number} */ stateBytes) => HEAD + 4 * n + stateBytes + 32,
    async _prefixFileWrite(/** @type {string} */ file, /** @type {number[]} */ tokens, /** @type {Buffer} */ state) {
      const head = Buffer.alloc(HEAD + 4 * tokens.length);
      id.copy(head);
      head.writeUInt32LE(tokens.length, 32);
      tokens.forEach((t, i) => head.writeInt32LE(t, HEAD + 4 * i));
      const body = Buffer.concat([head, state]);
      const bytes = Buffer.concat([body, digest(body)]);
      await fs.promises.writeFile(file, bytes);
      return bytes.length;
    },
    async _prefixFileRead(/** @type {string} */ file) {
      const bytes = await fs.promises.readFile(file);
      const body = bytes.subarray(0, bytes.length - 32);
      if (bytes.length < HEAD + 32 || !digest(body).equals(bytes.subarray(bytes.length - 32)))
        throw makeError('ERR_STATE_CORRUPT', `${file} fails its checksum`);
      const { tokens, stateAt } = parse(file, body);
      return { tokens, state: body.subarray(stateAt), bytes: bytes.length };
    },
    async _prefixFileTokens(/** @type {string} */ file) {
      const bytes = await fs.promises.readFile(file);
      return { tokens: parse(file, bytes).tokens, bytes: bytes.length };
    },
  };
  return { id, native };
}

const FINGERPRINT = fakeFingerprint(7);

/**
 * Fake tiers: a branch's "state" is 100 bytes naming its first token and position; a restore
 * gives a fake branch cut to `keep`. `restored` records each restore.
 */
function fakeTiers({ ramBytes = 0, dir = null, diskBytes = 0 } = {}) {
  const warnings = [];
  const restored = [];
  return {
    warnings,
    restored,
    ramBytes,
    dir,
    diskBytes,
    warn: (m) => warnings.push(m),
    fingerprint: FINGERPRINT,
    maxTokens: 4096,
    copyState: (branch) => Buffer.alloc(100, branch.position % 256),
    restoreState: async (state, keep) => {
      restored.push([state.length, keep]);
      return fakeBranch(keep);
    },
  };
}

/** A filled KV entry for `tokens`, used (pinned and unpinned) now. */
function cached(cache, tokens, pruned) {
  const e = cache.open(tokens, fakeBranch(tokens.length, pruned));
  cache.filled(e);
  cache.unpin(cache.pin(e));
  return e;
}

function tempDir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'lb-prefix-cache-'));
}

describe('PrefixCache (no model)', () => {
  it('bestStart: the longest whole entry, or a long enough shared run forked part-way', () => {
    const pruned = [];
    const cache = new PrefixCache();
    const system = range(0, 40);
    cache.filled(cache.open(system, fakeBranch(40, pruned)));
    const long = [...system, ...range(100, 130)];
    cache.filled(cache.open(long, fakeBranch(70, pruned)));
    let start = cache.bestStart([...system, 7, 8]);
    assert.deepEqual([start.entry.tokens, start.length, start.partial], [system, 40, false]);
    start = cache.bestStart([...system, ...range(100, 120), 5]);
    assert.deepEqual([start.entry.tokens, start.length, start.partial], [long, 60, true]);
    // A prompt wholly inside an entry forks it one token short: a part-way fork has no logits.
    start = cache.bestStart([...system, ...range(100, 120)]);
    assert.deepEqual([start.entry.tokens, start.length, start.partial], [long, 59, true]);
    // A shared run shorter than MIN_PARTIAL_REUSE is not worth pinning an unrelated entry.
    const other = range(500, 540);
    cache.filled(cache.open(other, fakeBranch(40, pruned)));
    start = cache.bestStart([...range(500, 500 + MIN_PARTIAL_REUSE - 1), 9]);
    assert.deepEqual([start.entry, start.length], [null, 0]);
    start = cache.bestStart([...range(500, 500 + MIN_PARTIAL_REUSE), 9]);
    assert.deepEqual([start.entry.tokens, start.length, start.partial], [other, MIN_PARTIAL_REUSE, true]);
  });

  it('bestStart: no part-way fork of a branch past the sliding window', () => {
    const cache = new PrefixCache({ slidingWindow: 32 });
    cache.filled(cache.open(range(0, 40), fakeBranch(40, [])));
    const start = cache.bestStart([...range(0, 20), 999]);
    assert.deepEqual([start.entry, start.length], [null, 0]);
  });

  it('bestStart sees only the KV cells: a prefix in RAM is restored first, then forked', async () => {
    const tiers = fakeTiers({ ramBytes: 1000 });
    const cache = new PrefixCache({ slidingWindow: 64, tiers });
    const tokens = range(0, 40);
    const e = cached(cache, tokens);
    cache.demote(e, 'kv');
    assert.equal(cache.bestStart(tokens).entry, null, 'in RAM only: not a start');
    assert.equal(cache.stored([...tokens, 5], 0), e);
    assert.equal(cache.stored([...tokens, 5], 40 - 15), null, 'saves fewer than MIN_GAIN tokens');
    assert.equal(await cache.promote(e, 40), true);
    // A restored state has no logits: never used whole, its last token is decoded again.
    let start = cache.bestStart(tokens);
    assert.deepEqual([start.entry, start.length, start.partial], [e, 39, true]);
    start = cache.bestStart([...tokens, 5]); // a longer prompt forks it whole and prefills the rest
    assert.deepEqual([start.length, start.partial], [40, false]);
    assert.ok(e.ram, 'the RAM copy stays (evicted again, no new copy)');
    assert.equal(cache.tierStats().ramHits, 1);
  });

  it('makeRoom (KV): least recently used first, never a pinned, unfilled or kept entry', () => {
    const pruned = [];
    const cache = new PrefixCache();
    const [a, b, c, d] = [1, 2, 3, 4].map((k) => cache.open([k], fakeBranch(1, pruned)));
    for (const e of [a, b, c]) cache.filled(e); // d is still being prefilled
    const branches = [a, b, c, d].map((e) => e.branch);
    cache.unpin(cache.pin(a)); // used first
    cache.unpin(cache.pin(b)); // used after a
    cache.pin(c); // in use
    assert.equal(cache.victim('kv'), a);
    assert.equal(
      makeRoomKv(cache, () => pruned.length >= 1),
      true,
    );
    assert.deepEqual(pruned, [branches[0]]);
    assert.equal(
      makeRoomKv(cache, () => pruned.length >= 3),
      false,
      'c is pinned and d unfilled: only b could go',
    );
    assert.deepEqual(pruned, branches.slice(0, 2));
    assert.deepEqual(
      [...cache.entries()].sort((x, y) => x.tokens[0] - y.tokens[0]),
      [c, d],
    );
    cache.unpin(c);
    assert.equal(
      makeRoomKv(cache, () => false, c),
      false,
      'the entry a request is about to fork is kept',
    );
    assert.equal(cache.size, 2);
    cache.demote(d, 'kv', false); // an unfilled entry whose request ended: not an eviction
    assert.equal(cache.evictions, 2);
    cache.clear();
    assert.equal(cache.size, 0);
    assert.equal(pruned.length, 4);
  });

  it('one victim rule in every tier: hinted entries go after all others, LRU kept across tiers', () => {
    const pruned = [];
    const tiers = fakeTiers({ ramBytes: 250 }); // two states of 100 bytes
    const cache = new PrefixCache({ tiers });
    const [a, b, c] = [0, 100, 200].map((k) => cached(cache, range(k, k + 20), pruned));
    a.hinted = true;
    for (const e of [c, b, a]) cache.unpin(cache.pin(e)); // c used first, a last
    assert.equal(cache.victim('kv'), c);
    assert.ok(makeRoomKv(cache, () => pruned.length >= 3));
    assert.deepEqual(
      pruned.map((p) => p.position),
      [20, 20, 20],
    );
    assert.equal(cache.size, 0);
    // Demoted in order c, b, then the hinted a: RAM holds two, so c (the least recently used)
    // left RAM as a came in: one LRU order down the tiers, the clock untouched by demotion.
    assert.deepEqual(
      [a, b, c].map((e) => e.ram !== null),
      [true, true, false],
    );
    assert.equal(cache.stored(c.tokens, 0), null, 'no disk tier: c left the cache');
    assert.deepEqual(cache.tierStats().ramEntries, 2);
    assert.equal(cache.victim('ram'), b, 'a is hinted: b leaves RAM first');
  });

  it('demotes KV → RAM → disk → gone and promotes from disk, files in a real folder', async () => {
    const dir = tempDir();
    try {
      const size = FINGERPRINT.native._prefixFileSize(20, 100);
      const tiers = fakeTiers({ ramBytes: 100, dir, diskBytes: 2 * size });
      const cache = new PrefixCache({ tiers });
      const changes = [];
      const stop = cache.onChange((c) => changes.push(c));
      const [a, b, c] = [0, 100, 200].map((k) => cached(cache, range(k, k + 20)));
      assert.ok(makeRoomKv(cache, () => cache.size === 0));
      await cache.flush(); // (writes c too, as a closing scheduler does)
      // Demoted a, b, c (least recently used first): RAM holds one, so a and b went to disk; c
      // written last needs room on disk, where a is the least recently used file: a is gone.
      assert.deepEqual(
        [a, b, c].map((e) => [e.branch === null, e.ram !== null, e.file !== null]),
        [
          [true, false, false],
          [true, false, true],
          [true, true, true],
        ],
      );
      assert.equal(fs.readdirSync(dir).length, 2);
      assert.deepEqual(cache.tierStats(), {
        ramBytes: 100,
        diskBytes: 2 * size,
        ramEntries: 1,
        diskEntries: 2,
        diskOn: true,
        kvHits: 0,
        ramHits: 0,
        diskHits: 0,
        restoredTokens: 0,
        spills: 3,
        diskWrites: 3,
        diskFailures: 0,
        skipped: 0,
      });
      assert.equal(cache.stored(a.tokens, 0), null, 'a left its last tier');
      assert.deepEqual(
        changes.filter((x) => x.type === 'removed' && x.tiers.length === 0).map((x) => x.tokens[0]),
        [0],
        'a prefix leaves its last tier once (its state on its way to a file is on disk)',
      );
      assert.deepEqual(
        changes.filter((x) => x.type === 'stored').map((x) => `${x.tokens[0]}:${x.medium}`),
        ['0:kv', '100:kv', '200:kv', '0:ram', '100:ram', '0:disk', '200:ram', '100:disk', '200:disk'],
      );
      // Back from disk: read, checked, restored one token short of a prompt it covers whole.
      await restoreFor(cache, [b.tokens], true, true);
      assert.deepEqual(tiers.restored, [[100, 19]]);
      const restored = cache.bestStart([...b.tokens, 1]);
      assert.deepEqual([restored.entry.tokens, restored.entry.hinted], [b.tokens.slice(0, 19), true]);
      assert.equal(cache.tierStats().diskHits, 1);
      assert.ok(b.ram, 'a state read from disk keeps a RAM copy');
      assert.equal(changes.at(-1).type, 'stored');
      stop();
      cache.clear();
      assert.equal(changes.at(-1).type, 'stored', 'unsubscribed');
      assert.deepEqual(tiers.warnings, []);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("lists other processes' files, skips corrupted and foreign ones with a warning", async () => {
    const dir = tempDir();
    try {
      const tokens = range(0, 30);
      await writeEntryFile(dir, FINGERPRINT, tokens, Buffer.alloc(64, 1));
      await writeEntryFile(dir, fakeFingerprint(9), range(50, 80), Buffer.alloc(64, 2)); // other settings
      const corrupt = range(100, 130);
      await writeEntryFile(dir, FINGERPRINT, corrupt, Buffer.alloc(64, 3));
      const file = path.join(dir, entryName(FINGERPRINT, corrupt));
      const bytes = fs.readFileSync(file);
      bytes[bytes.length - 40] ^= 1;
      fs.writeFileSync(file, bytes);
      const tiers = fakeTiers({ ramBytes: 0, dir, diskBytes: 1e6 });
      const cache = new PrefixCache({ tiers });
      await cache.scan();
      assert.equal(cache.tierStats().diskEntries, 2, 'the foreign file is not listed');
      assert.equal(cache.tierStats().skipped, 1);
      assert.match(tiers.warnings.join(' | '), /another model or KV layout/);
      const at = (t) => [...t, 1];
      await restoreFor(cache, [at(corrupt)], true);
      assert.match(tiers.warnings.join(' | '), /checksum/);
      assert.equal(fs.existsSync(file), false, 'a corrupted file is removed');
      assert.equal(cache.stored([...corrupt, 1], 0), null);
      await restoreFor(cache, [at(tokens)], true);
      assert.deepEqual(tiers.restored, [[64, 30]]);
      // A start that does not fit is told so, nothing restored.
      cache.clear();
      const unfit = await restoreFor(cache, [at(tokens)], false);
      assert.equal(unfit, 1, 'no room: the start is told, to be admitted as it is');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('onChange: stored once filled, removed with the tiers left, cleared when a scheduler closes', () => {
    const cache = new PrefixCache({ tiers: fakeTiers({ ramBytes: 1000 }) });
    const changes = [];
    cache.onChange((c) => changes.push([c.type, c.medium, c.tokens && c.tokens[0], c.tiers && c.tiers.join()]));
    const unfilled = cache.open(range(50, 70), fakeBranch(20));
    cache.forget(unfilled); // never filled: nobody was told it was there
    const [a, b] = [0, 100].map((k) => cached(cache, range(k, k + 20)));
    cache.demote(a, 'kv');
    const short = cached(cache, range(200, 205)); // too short to keep below the KV cells
    cache.demote(short, 'kv');
    cache.clear();
    assert.deepEqual(changes, [
      ['stored', 'kv', 0, 'kv'],
      ['stored', 'kv', 100, 'kv'],
      ['stored', 'ram', 0, 'kv,ram'],
      ['removed', 'kv', 0, 'ram'],
      ['stored', 'kv', 200, 'kv'],
      ['removed', 'kv', 200, ''],
      ['stored', 'ram', 100, 'kv,ram'],
      ['cleared', 'kv', undefined, undefined],
    ]);
    assert.equal(b.branch, null);
  });

  it('a failed write turns the disk tier off with a warning; the cache goes on in RAM', async () => {
    const dir = path.join(tempDir(), 'gone');
    const tiers = fakeTiers({ ramBytes: 150, dir, diskBytes: 1e6 });
    const cache = new PrefixCache({ tiers });
    fs.rmSync(dir, { recursive: true });
    const [a, b] = [0, 100].map((k) => cached(cache, range(k, k + 20)));
    makeRoomKv(cache, () => cache.size === 0);
    await cache.flush();
    assert.match(tiers.warnings.join(' | '), /disk tier is off/);
    assert.deepEqual([a.ram !== null, b.ram !== null, cache.tierStats().diskOn], [false, true, false]);
    assert.equal(cache.stored(a.tokens, 0), null);
  });
});
