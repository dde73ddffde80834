'use strict';

/**
 * The prefix cache as KV blocks: the one event source of the KV-aware routers' streams (the
 * ZeroMQ publisher of `--kv-events`, ./kv-events.js, and the gRPC worker's `SubscribeKvEvents`,
 * ./grpc.js). Blocks are 16 tokens; a block's hash chains its parent's (so equal hashes mean
 * equal prefixes) and only whole blocks count. A block is stored when the first cached prefix
 * holding it enters any tier (`medium`: "GPU" for the KV cells, whatever the device, "CPU" for
 * RAM, "DISK"), and removed when the last prefix holding it leaves the cache.
 *
 * Events are data, in no wire format: `{ type: 'stored', hashes, parent, blocks, medium }`
 * (`blocks[i]`: `{ tokens, images }`, images null or `[id, offset]` per image among the block's
 * positions, id the SHA-256 of the file bytes, offset where the image starts relative to the
 * block; image positions' tokens are negative), `{ type: 'removed', hashes, medium }`. The events
 * of one scheduler step reach each listener as one batch, after the step.
 */

const { createHash } = require('node:crypto');
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

/**
 * Each whole block's `[id, offset]` per image among its positions (null: none), or null when no
 * block holds one.
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

class KvBlockLedger {
  /** @param {{ watchCache: Function }} scheduler */
  constructor(scheduler) {
    /** Cached prefixes by their tokens: the tiers holding each, its images. @type {Map<string, { tokens: number[], tiers: string[], images: any[] }>} */
    this._prefixes = new Map();
    /** Blocks held, by hash, parents before children: refs, parent, tokens, images, medium. */
    this._blocks = new Map();
    this._listeners = new Set();
    this._pending = [];
    this._flushQueued = false;
    const { held, unsubscribe } = scheduler.watchCache((change) => this._change(change));
    this._unsubscribe = unsubscribe;
    for (const p of held)
      this._change({ type: 'stored', tokens: p.tokens, images: p.images, medium: p.tiers[0], tiers: p.tiers });
  }

  /** Calls `listener(events)` with each step's events; returns the unsubscribe function. */
  listen(listener) {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** Every block held now, one `stored` event each, parents before children. */
  snapshot() {
    return [...this._blocks.keys()].map((hash) => this._storedEvent([hash]));
  }

  _change(change) {
    if (change.type === 'cleared') {
      for (const [key, p] of this._prefixes) {
        const tiers = p.tiers.filter((t) => t !== 'kv');
        this._setTiers(key, p.tokens, tiers, 'kv', p.images);
      }
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
        const blockImages = (imagesOf && imagesOf[i]) || null;
        this._blocks.set(hash, {
          refs: 1,
          parent,
          tokens: blockTokens,
          images: blockImages,
          medium: MEDIUM[medium] || 'GPU',
        });
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
    if (gone.length > 0) this._queue({ type: 'removed', hashes: gone.reverse(), medium: MEDIUM[medium] || 'GPU' });
  }

  /** One `stored` event of consecutive blocks (each the next one's parent). */
  _storedEvent(hashes) {
    const blocks = hashes.map((h) => this._blocks.get(h));
    const { parent, medium } = blocks[0];
    return {
      type: 'stored',
      hashes,
      parent,
      blocks: blocks.map((b) => ({ tokens: b.tokens, images: b.images })),
      medium,
    };
  }

  /** Events of one step go out as one batch, after the step (cache listeners run inside it). */
  _queue(event) {
    this._pending.push(event);
    if (this._flushQueued) return;
    this._flushQueued = true;
    setImmediate(() => {
      this._flushQueued = false;
      const events = this._pending.splice(0);
      if (events.length > 0) for (const listener of this._listeners) listener(events);
    });
  }

  close() {
    this._unsubscribe();
    this._listeners.clear();
  }
}

module.exports = { KvBlockLedger, blockHashes, BLOCK_SIZE };
