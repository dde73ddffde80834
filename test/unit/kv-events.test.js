'use strict';

// The KV event publisher's bookkeeping over a fake scheduler (no model): which blocks a change
// stores or removes across the tiers, what a late subscriber's replay holds, what `cleared` keeps.
// The peer here speaks just enough ZMTP to subscribe and read frames; the stream itself is checked
// against NVIDIA Dynamo's indexer in test/kv-events.test.js.

const assert = require('node:assert/strict');
const net = require('node:net');
const { decode } = require('@msgpack/msgpack');
const { KvEventPublisher, blockHashes } = require('../../lib/server/kv-events');

/** A scheduler stand-in: the prefixes it holds, and the listener the publisher gave it. */
function fakeScheduler(held = []) {
  const s = { listener: null };
  s.watchCache = (listener) => {
    s.listener = listener;
    return { held, unsubscribe: () => (s.listener = null) };
  };
  return s;
}

/** A SUB peer: ZMTP 3.0 greeting, READY (SUB), a subscription to `kv@`; `next()` is the next message. */
async function subscriber(address) {
  const [, host, port] = /^tcp:\/\/(.+):(\d+)$/.exec(address);
  const socket = net.connect(Number(port), host);
  await new Promise((resolve) => socket.once('connect', resolve));
  const greeting = Buffer.alloc(64);
  greeting[0] = 0xff;
  greeting[9] = 0x7f;
  greeting[10] = 3;
  greeting.write('NULL', 12, 'ascii');
  const name = Buffer.from('Socket-Type');
  const ready = Buffer.concat([Buffer.from([5]), Buffer.from('READY'), Buffer.from([name.length]), name]);
  const value = Buffer.from('SUB');
  const size = Buffer.alloc(4);
  size.writeUInt32BE(value.length);
  const readyBody = Buffer.concat([ready, size, value]);
  const topic = Buffer.concat([Buffer.from([1]), Buffer.from('kv@')]);
  socket.write(Buffer.concat([greeting, Buffer.from([0x04, readyBody.length]), readyBody]));
  socket.write(Buffer.concat([Buffer.from([0x00, topic.length]), topic]));
  let buffer = Buffer.alloc(0);
  let greeted = false;
  let parts = [];
  const messages = [];
  const waiting = [];
  socket.on('data', (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    if (!greeted && buffer.length >= 64) {
      greeted = true;
      buffer = buffer.subarray(64);
    }
    while (greeted && buffer.length >= 2) {
      const flags = buffer[0];
      const long = (flags & 2) !== 0;
      if (long && buffer.length < 9) return;
      const n = long ? Number(buffer.readBigUInt64BE(1)) : buffer[1];
      const start = long ? 9 : 2;
      if (buffer.length < start + n) return;
      const body = buffer.subarray(start, start + n);
      buffer = buffer.subarray(start + n);
      if (flags & 4) continue; // the PUB's READY
      parts.push(Buffer.from(body));
      if (flags & 1) continue;
      const [t, seq, payload] = parts;
      parts = [];
      const message = {
        topic: t.toString(),
        seq: Number(seq.readBigInt64BE(0)),
        batch: decode(payload, { useBigInt64: true }),
      };
      if (waiting.length > 0) waiting.shift()(message);
      else messages.push(message);
    }
  });
  return {
    next: () => (messages.length > 0 ? Promise.resolve(messages.shift()) : new Promise((r) => waiting.push(r))),
    close: () => socket.destroy(),
  };
}

const tokens = (from, n) => Array.from({ length: n }, (_, i) => from + i);

describe('KvEventPublisher (fake scheduler)', function () {
  let publisher;
  let sub;
  afterEach(async () => {
    if (sub) sub.close();
    if (publisher) await publisher.close();
  });

  it('replays what is held to a late subscriber, then publishes stored and removed blocks as the tiers change', async () => {
    const shared = tokens(100, 40); // 2 whole blocks + 8 tokens
    const scheduler = fakeScheduler([{ tokens: shared, tiers: ['kv'] }]);
    publisher = new KvEventPublisher(scheduler, { model: 'm', pod: 'p', format: 'array' });
    const address = await publisher.bind('tcp://127.0.0.1:0');
    sub = await subscriber(address);

    const replay = await sub.next();
    assert.equal(replay.topic, 'kv@p@m');
    // Under the last sequence number sent (1: the prefixes held at the start, sent to nobody).
    assert.equal(replay.seq, publisher.sequence);
    assert.equal(replay.seq, 1);
    const [h1, h2] = blockHashes(shared);
    assert.deepEqual(
      replay.batch[1].map((e) => e[0]),
      ['AllBlocksCleared', 'BlockStored', 'BlockStored'],
    );
    assert.deepEqual(replay.batch[1][1], ['BlockStored', [h1], null, shared.slice(0, 16), 16, null, 'GPU']);
    assert.deepEqual(replay.batch[1][2], ['BlockStored', [h2], h1, shared.slice(16, 32), 16, null, 'GPU']);

    // A longer prefix sharing the first two blocks, stored in RAM: only its third block is new.
    const longer = [...shared.slice(0, 32), ...tokens(500, 20)];
    scheduler.listener({ type: 'stored', tokens: longer, medium: 'ram', tiers: ['ram'] });
    const stored = await sub.next();
    assert.equal(stored.seq, 2);
    const h3 = blockHashes(longer)[2];
    assert.deepEqual(stored.batch[1], [['BlockStored', [h3], h2, longer.slice(32, 48), 16, null, 'CPU']]);

    // The first prefix moves from the KV cells to disk (stored there, then out of the cells): no event.
    scheduler.listener({ type: 'stored', tokens: shared, medium: 'disk', tiers: ['kv', 'disk'] });
    scheduler.listener({ type: 'removed', tokens: shared, medium: 'kv', tiers: ['disk'] });
    // The longer one leaves the cache: its own block goes, the shared two stay (the first still holds them).
    scheduler.listener({ type: 'removed', tokens: longer, medium: 'ram', tiers: [] });
    const removed = await sub.next();
    assert.equal(removed.seq, 3);
    assert.deepEqual(removed.batch[1], [['BlockRemoved', [h3], 'CPU']]);

    // `cleared` frees the KV cells only: a prefix on disk stays; one only in the cells leaves.
    const cellsOnly = tokens(900, 16);
    scheduler.listener({ type: 'stored', tokens: cellsOnly, medium: 'kv', tiers: ['kv'] });
    await sub.next();
    scheduler.listener({ type: 'cleared', medium: 'kv' });
    const cleared = await sub.next();
    assert.deepEqual(cleared.batch[1], [['BlockRemoved', blockHashes(cellsOnly), 'GPU']]);

    // Last, the first prefix leaves disk: its blocks go, deepest first.
    scheduler.listener({ type: 'removed', tokens: shared, medium: 'disk', tiers: [] });
    const last = await sub.next();
    assert.deepEqual(last.batch[1], [['BlockRemoved', [h2, h1], 'DISK']]);
    assert.equal(last.seq, 6);
  });

  it('maps (the default) carry the group, the spec kind and, for blocks with image positions, the image ids', async () => {
    const scheduler = fakeScheduler();
    publisher = new KvEventPublisher(scheduler, { model: 'm', pod: 'p' });
    assert.equal(publisher.format, 'map');
    sub = await subscriber(await publisher.bind('tcp://127.0.0.1:0'));
    assert.deepEqual((await sub.next()).batch[1], [{ type: 'AllBlocksCleared' }]);

    // Text, an image of 20 positions from 10 (its keys negative, as the cache holds them), text: 3 whole blocks.
    const id = 'ab'.repeat(32);
    const prefix = [...tokens(100, 10), ...Array.from({ length: 20 }, (_, k) => -2 - 2 * k), ...tokens(200, 20)];
    scheduler.listener({
      type: 'stored',
      tokens: prefix,
      images: [{ start: 10, nPos: 20, id }],
      medium: 'kv',
      tiers: ['kv'],
    });
    const hashes = blockHashes(prefix);
    const [stored] = (await sub.next()).batch[1];
    assert.deepEqual(stored, {
      type: 'BlockStored',
      block_hashes: hashes,
      parent_block_hash: null,
      token_ids: prefix.slice(0, 48).map((t) => (t < 0 ? 0 : t)),
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
      lora_name: null,
      extra_keys: [[[id, 10]], [[id, -6]], null],
      group_idx: 0,
      kv_cache_spec_kind: 'full_attention',
    });

    // Text only: no extra_keys at all (vLLM omits a field at its default).
    const text = tokens(700, 16);
    scheduler.listener({ type: 'stored', tokens: text, images: [], medium: 'ram', tiers: ['ram'] });
    const [plain] = (await sub.next()).batch[1];
    assert.equal('extra_keys' in plain, false);
    assert.deepEqual(plain.token_ids, text);
    scheduler.listener({ type: 'removed', tokens: text, images: [], medium: 'ram', tiers: [] });
    assert.deepEqual((await sub.next()).batch[1], [
      { type: 'BlockRemoved', block_hashes: blockHashes(text), medium: 'CPU', group_idx: 0 },
    ]);
    assert.throws(
      () => new KvEventPublisher(fakeScheduler(), { model: 'm', format: /** @type {any} */ ('json') }),
      /map or array/,
    );
  });

  it('refuses an endpoint that is not tcp://HOST:PORT', async () => {
    publisher = new KvEventPublisher(fakeScheduler(), { model: 'm', pod: 'p' });
    await assert.rejects(publisher.bind('udp://127.0.0.1:1'), /tcp:\/\/HOST:PORT/);
  });
});
