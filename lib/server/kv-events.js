'use strict';

/**
 * `serve --kv-events tcp://HOST:PORT`: the prefix cache as KV events in vLLM's wire format, for
 * KV-aware routers (llm-d's precise prefix scorer, NVIDIA Dynamo's KV router, Ray Serve's): a
 * ZeroMQ PUB socket (./zmtp.js), topic `kv@<pod>@<model>`, each message three frames — the
 * topic, a sequence number (8 bytes, big-endian) and a msgpack batch `[timestamp, [events...],
 * data_parallel_rank]`. An event is, by `format`:
 * - `'map'` (default; what vLLM sends since it dropped msgspec's array_like on its events): a map
 *   tagged by `type` — `BlockStored` with `block_hashes`, `parent_block_hash`, `token_ids`,
 *   `block_size`, `lora_id`, `medium`, `lora_name`, `group_idx` 0 and `kv_cache_spec_kind`
 *   `full_attention` (our KV is one group: a cached prefix holds every layer's cells, a
 *   sliding-window layer's last window included, and is reused from its start, which is what a
 *   router matches; routers drop events of vLLM's `sliding_window` groups) and, for blocks holding
 *   image positions, `extra_keys` (per block: null, or an `[id, offset]` pair per image in it, as
 *   vLLM writes its multimodal keys — id the SHA-256 of the file bytes, offset where the image
 *   starts relative to the block, negative when before it; their positions' `token_ids` are 0);
 *   `BlockRemoved` with `block_hashes`,
 *   `medium`, `group_idx`; `AllBlocksCleared`. Optional fields left at their default are
 *   omitted, as vLLM's encoder does.
 * - `'array'`: vLLM's earlier positional form, `["BlockStored", block_hashes, parent_block_hash,
 *   token_ids, block_size, lora_id, medium]`, `["BlockRemoved", block_hashes, medium]`,
 *   `["AllBlocksCleared"]` (image positions as their negative keys), for consumers that read
 *   only that.
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
const FORMATS = ['map', 'array'];
/** What a map's `token_ids` hold at an image's positions (the image is named by `extra_keys`). */
const IMAGE_POSITION_TOKEN = 0;
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

/**
 * Each whole block's `[id, offset]` per image among its positions (null: none; offset: where the
 * image starts, relative to the block), or null when no block holds one.
 * @param {{ start: number, nPos: number, id: string }[]} images @param {number} blocks
 */
function blockImages(images, blocks) {
  if (images.length === 0) return null;
  return Array.from({ length: blocks }, (_, b) => {
    const [from, to] = [b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE];
    const keys = images.filter((s) => s.start < to && s.start + s.nPos > from).map((s) => [s.id, s.start - from]);
    return keys.length > 0 ? keys : null;
  });
}

class KvEventPublisher {
  /**
   * @param {{ watchCache: Function }} scheduler
   * @param {{ model: string, pod?: string, format?: 'map' | 'array' }} options the topic's parts
   *   (pod: POD_NAME, else the host name) and the events' encoding
   */
  constructor(scheduler, { model, pod = process.env.POD_NAME || os.hostname(), format = 'map' }) {
    if (!FORMATS.includes(format))
      throw new TypeError(`the KV event format must be ${FORMATS.join(' or ')}, got ${JSON.stringify(format)}`);
    this.format = format;
    this.topic = Buffer.from(`kv@${pod}@${model}`);
    /** Cached prefixes by their tokens: the tiers holding each, its images. @type {Map<string, { tokens: number[], tiers: string[], images: any[] }>} */
    this._prefixes = new Map();
    /** Blocks held, by hash: how many held prefixes hold each, its parent, tokens and medium. */
    this._blocks = new Map();
    this._seq = 0n;
    this._pending = [];
    this._flushQueued = false;
    this._socket = new PubSocket({ onSubscribe: (peer, topic) => this._replay(peer, topic) });
    const { held, unsubscribe } = scheduler.watchCache((change) => this._change(change));
    this._unsubscribe = unsubscribe;
    for (const p of held)
      this._change({ type: 'stored', tokens: p.tokens, images: p.images, medium: p.tiers[0], tiers: p.tiers });
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
          p.images,
        );
      return;
    }
    this._setTiers(change.tokens.join(','), change.tokens, change.tiers, change.medium, change.images || []);
  }

  /** A prefix is now held by `tiers`: its blocks stored when it entered the cache, released when it left. */
  _setTiers(key, tokens, tiers, medium, images) {
    const known = this._prefixes.get(key);
    const wasHeld = Boolean(known && known.tiers.length > 0);
    if (tiers.length > 0) this._prefixes.set(key, { tokens, tiers: [...tiers], images });
    else this._prefixes.delete(key);
    if (!wasHeld && tiers.length > 0) this._hold(tokens, medium, images);
    else if (wasHeld && tiers.length === 0) this._release(tokens, medium);
  }

  _hold(tokens, medium, images) {
    const hashes = blockHashes(tokens);
    const imagesOf = blockImages(images, hashes.length);
    let parent = null;
    const fresh = [];
    hashes.forEach((hash, i) => {
      const block = this._blocks.get(hash);
      if (block) block.refs++;
      else {
        const blockTokens = tokens.slice(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE);
        const images = imagesOf && imagesOf[i];
        this._blocks.set(hash, { refs: 1, parent, tokens: blockTokens, images, medium: MEDIUM[medium] || 'GPU' });
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
    if (gone.length > 0) this._queue(this._removedEvent(gone.reverse(), MEDIUM[medium] || 'GPU'));
  }

  /** One BlockStored of consecutive blocks (each the next one's parent), in the publisher's format. */
  _storedEvent(hashes) {
    const blocks = hashes.map((h) => this._blocks.get(h));
    const [first] = blocks;
    const tokens = blocks.flatMap((b) => b.tokens);
    if (this.format === 'array') return ['BlockStored', hashes, first.parent, tokens, BLOCK_SIZE, null, first.medium];
    const extraKeys = blocks.some((b) => b.images) ? blocks.map((b) => b.images || null) : null;
    return {
      type: 'BlockStored',
      block_hashes: hashes,
      parent_block_hash: first.parent,
      token_ids: extraKeys ? tokens.map((t) => (t < 0 ? IMAGE_POSITION_TOKEN : t)) : tokens,
      block_size: BLOCK_SIZE,
      lora_id: null,
      medium: first.medium,
      lora_name: null,
      ...(extraKeys ? { extra_keys: extraKeys } : {}),
      group_idx: 0,
      kv_cache_spec_kind: 'full_attention',
    };
  }

  _removedEvent(hashes, medium) {
    if (this.format === 'array') return ['BlockRemoved', hashes, medium];
    return { type: 'BlockRemoved', block_hashes: hashes, medium, group_idx: 0 };
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
    const events = [this.format === 'array' ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' }];
    // Parents before children: a block's parent was stored before it, so insertion order holds.
    for (const hash of this._blocks.keys()) events.push(this._storedEvent([hash]));
    peer.send(this._message(events, this._seq), true);
  }

  async close() {
    this._unsubscribe();
    await this._socket.close();
  }
}

module.exports = { KvEventPublisher, blockHashes, KV_EVENT_FORMATS: FORMATS };
