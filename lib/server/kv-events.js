'use strict';

/**
 * `serve --kv-events tcp://HOST:PORT`: the prefix cache as KV events in vLLM's wire format, for
 * KV-aware routers (llm-d's precise prefix scorer, NVIDIA Dynamo's KV router, Ray Serve's): a
 * ZeroMQ PUB socket (./zmtp.js), topic `kv@<pod>@<model>`, each message three frames — the
 * topic, a sequence number (8 bytes, big-endian) and a msgpack batch `[timestamp, [events...],
 * data_parallel_rank]` of `["BlockStored", block_hashes, parent_block_hash, token_ids,
 * block_size, lora_id, medium]`, `["BlockRemoved", block_hashes, medium]` and
 * `["AllBlocksCleared"]` (vLLM's array-like encoding).
 *
 * Blocks are 16 tokens; a block's hash chains its parent's (so equal hashes mean equal prefixes)
 * and only whole blocks are published. A block is stored when the first cached prefix holding it
 * enters any tier (`medium`: "GPU" for the KV cells, whatever the device, "CPU" for RAM, "DISK"),
 * and removed when the last prefix holding it leaves the cache. A subscriber that joins late gets
 * a replay of the current state, to it alone, under the last sequence number sent:
 * AllBlocksCleared (dropping what an earlier process on this address told it), then every block
 * held. Live batches carry sequence numbers 1, 2, ...
 */

const os = require('node:os');
const { createHash } = require('node:crypto');
const { encode } = require('@msgpack/msgpack');
const { PubSocket } = require('./zmtp');
const { BLOCK_SIZE } = require('./metrics');

const MEDIUM = { kv: 'GPU', ram: 'CPU', disk: 'DISK' };
const HASH_MASK = (1n << 63n) - 1n; // hashes as non-negative signed 64-bit integers

/** The hash of a block: its parent's hash and its tokens (chained, so a hash names a whole prefix). */
function blockHash(parent, tokens) {
  const bytes = Buffer.alloc(8 + 4 * tokens.length);
  bytes.writeBigUInt64LE(parent === null ? 0n : parent, 0);
  for (let i = 0; i < tokens.length; i++) bytes.writeInt32LE(tokens[i], 8 + 4 * i);
  return createHash('sha256').update(bytes).digest().readBigUInt64LE(0) & HASH_MASK;
}

/** The chained hashes of the whole blocks of `tokens`. */
function blockHashes(tokens) {
  const hashes = [];
  let parent = null;
  for (let end = BLOCK_SIZE; end <= tokens.length; end += BLOCK_SIZE) {
    parent = blockHash(parent, tokens.slice(end - BLOCK_SIZE, end));
    hashes.push(parent);
  }
  return hashes;
}

class KvEventPublisher {
  /**
   * @param {{ watchCache: Function }} scheduler
   * @param {{ model: string, pod?: string }} options the topic's parts (pod: POD_NAME, else the host name)
   */
  constructor(scheduler, { model, pod = process.env.POD_NAME || os.hostname() }) {
    this.topic = Buffer.from(`kv@${pod}@${model}`);
    /** Cached prefixes by their tokens: the tiers holding each. @type {Map<string, { tokens: number[], tiers: string[] }>} */
    this._prefixes = new Map();
    /** Blocks held, by hash: how many held prefixes hold each, its parent, tokens and medium. */
    this._blocks = new Map();
    this._seq = 0n;
    this._pending = [];
    this._flushQueued = false;
    this._socket = new PubSocket({ onSubscribe: (peer, topic) => this._replay(peer, topic) });
    const { held, unsubscribe } = scheduler.watchCache((change) => this._change(change));
    this._unsubscribe = unsubscribe;
    for (const p of held) this._change({ type: 'stored', tokens: p.tokens, medium: p.tiers[0], tiers: p.tiers });
  }

  /** The sequence number of the last batch published (0: none yet). */
  get sequence() {
    return Number(this._seq);
  }

  /** Binds the socket; resolves with the bound address. */
  bind(endpoint) {
    return this._socket.bind(endpoint);
  }

  _change(change) {
    if (change.type === 'cleared') {
      for (const [key, p] of this._prefixes)
        this._setTiers(
          key,
          p.tokens,
          p.tiers.filter((t) => t !== 'kv'),
          'kv',
        );
      return;
    }
    this._setTiers(change.tokens.join(','), change.tokens, change.tiers, change.medium);
  }

  /** A prefix is now held by `tiers`: its blocks stored when it entered the cache, released when it left. */
  _setTiers(key, tokens, tiers, medium) {
    const known = this._prefixes.get(key);
    const wasHeld = Boolean(known && known.tiers.length > 0);
    if (tiers.length > 0) this._prefixes.set(key, { tokens, tiers: [...tiers] });
    else this._prefixes.delete(key);
    if (!wasHeld && tiers.length > 0) this._hold(tokens, medium);
    else if (wasHeld && tiers.length === 0) this._release(tokens, medium);
  }

  _hold(tokens, medium) {
    const hashes = blockHashes(tokens);
    let parent = null;
    const fresh = [];
    hashes.forEach((hash, i) => {
      const block = this._blocks.get(hash);
      if (block) block.refs++;
      else {
        const blockTokens = tokens.slice(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE);
        this._blocks.set(hash, { refs: 1, parent, tokens: blockTokens, medium: MEDIUM[medium] || 'GPU' });
        fresh.push(hash);
      }
      parent = hash;
    });
    if (fresh.length > 0) this._queue(this._storedEvent(fresh));
  }

  _release(tokens, medium) {
    const gone = [];
    for (const hash of blockHashes(tokens)) {
      const block = this._blocks.get(hash);
      if (!block) continue;
      if (--block.refs === 0) {
        this._blocks.delete(hash);
        gone.push(hash);
      }
    }
    // Deepest first: a consumer never sees a block outlive its parent.
    if (gone.length > 0) this._queue(['BlockRemoved', gone.reverse(), MEDIUM[medium] || 'GPU']);
  }

  /** One BlockStored of consecutive blocks (each the next one's parent). */
  _storedEvent(hashes) {
    const first = this._blocks.get(hashes[0]);
    const tokens = hashes.flatMap((h) => this._blocks.get(h).tokens);
    return ['BlockStored', hashes, first.parent, tokens, BLOCK_SIZE, null, first.medium];
  }

  /** Events of one step go out as one batch, after the step (listeners run inside it). */
  _queue(event) {
    this._pending.push(event);
    if (this._flushQueued) return;
    this._flushQueued = true;
    setImmediate(() => {
      this._flushQueued = false;
      const events = this._pending.splice(0);
      if (events.length > 0) this._publish(events);
    });
  }

  _publish(events) {
    this._seq++;
    this._socket.send(this._message(events, this._seq));
  }

  _message(events, seq) {
    const seqBytes = Buffer.alloc(8);
    seqBytes.writeBigInt64BE(seq);
    const payload = Buffer.from(encode([Date.now() / 1000, events, 0], { useBigInt64: true }));
    return [this.topic, seqBytes, payload];
  }

  /** A subscriber to our topic (or a prefix of it) gets the current state, to it alone. */
  _replay(peer, topic) {
    if (!this.topic.subarray(0, topic.length).equals(topic)) return;
    const events = [['AllBlocksCleared']];
    // Parents before children: a block's parent was stored before it, so insertion order holds.
    for (const hash of this._blocks.keys()) events.push(this._storedEvent([hash]));
    peer.send(this._message(events, this._seq), true);
  }

  async close() {
    this._unsubscribe();
    await this._socket.close();
  }
}

module.exports = { KvEventPublisher, blockHashes };
