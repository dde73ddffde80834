'use strict';

/**
 * The KV event ledger (./kv-blocks.js) as SMG's `SubscribeKvEvents` stream (./grpc.js):
 * `KvEventBatch` messages numbered 1, 2, ... (one per scheduler step that changed the cache),
 * each block with its 16 token ids (SMG hashes them itself; the hashes here only chain parents
 * and name what is removed).
 *
 * A subscriber asking from 0 gets the current state first, as one batch under the last number
 * sent: KvCacheCleared, then every block held, parents first. One asking from N resumes after N:
 * the batches it missed from the recent ones kept, or OUT_OF_RANGE when they are gone or N is
 * ahead of this process (it restarted) — SMG then clears the worker and asks from 0. A subscriber
 * that stops reading while more than `maxBuffered` bytes wait is ended with DATA_LOSS (SMG
 * resubscribes from 0) rather than let the worker's memory grow.
 */

const grpc = require('@grpc/grpc-js');
const { BLOCK_SIZE } = require('./kv-blocks');

const KEPT_BATCHES = 1024;

/** A ledger event as a KvCacheEvent message. */
function kvCacheEvent(event, eventId) {
  if (event.type === 'removed')
    return {
      event_id: eventId,
      removed: { block_hashes: event.hashes.map(String), medium: event.medium, group_idx: 0 },
    };
  const blocks = event.blocks.map((b, i) => ({
    block_hash: String(event.hashes[i]),
    token_ids: b.tokens.map((t) => (t < 0 ? 0 : t)), // an image's positions: named by extra_keys
    block_size: BLOCK_SIZE,
    extra_keys: (b.images || []).map(([identifier, offset]) => ({
      multimodal: { identifier, offset: String(offset) },
    })),
  }));
  const parent = event.parent === null ? {} : { parent_block_hash: String(event.parent) };
  return {
    event_id: eventId,
    stored: { blocks, ...parent, medium: event.medium, group_idx: 0, kv_cache_spec_kind: 'full_attention' },
  };
}

class KvEventStream {
  /** @param {{ listen: Function, snapshot: Function }} ledger @param {{ maxBuffered?: number }} [options] */
  constructor(ledger, { maxBuffered = 64 << 20 } = {}) {
    this.ledger = ledger;
    this.maxBuffered = maxBuffered;
    this.sequence = 0;
    this.eventId = 0;
    /** The last KEPT_BATCHES batches, oldest first. */
    this.recent = [];
    this.subscribers = new Set();
    this._unlisten = ledger.listen((events) => this._publish(events));
  }

  _batch(sequence, events) {
    return {
      sequence_number: String(sequence),
      timestamp: Date.now() / 1000,
      events: events.map((e) => kvCacheEvent(e, String(++this.eventId))),
    };
  }

  _publish(events) {
    const batch = this._batch(++this.sequence, events);
    this.recent.push(batch);
    if (this.recent.length > KEPT_BATCHES) this.recent.shift();
    for (const call of this.subscribers) this._write(call, batch);
  }

  _write(call, batch) {
    if (call.writableLength > this.maxBuffered) {
      this.subscribers.delete(call);
      call.emit('error', { code: grpc.status.DATA_LOSS, details: 'the subscriber fell behind: resubscribe from 0' });
      return;
    }
    call.write(batch);
  }

  /** SubscribeKvEvents: the replay or snapshot asked for, then live batches until the call ends. */
  subscribe(call) {
    const from = Number(call.request.start_sequence_number || 0);
    call.sendMetadata(new grpc.Metadata()); // SMG's subscribe returns once headers arrive
    if (from === 0) {
      const snapshot = this._batch(this.sequence, []);
      snapshot.events = [
        { event_id: String(++this.eventId), cleared: {} },
        ...this.ledger.snapshot().map((e) => kvCacheEvent(e, String(++this.eventId))),
      ];
      call.write(snapshot);
    } else {
      const missed = this.recent.filter((b) => Number(b.sequence_number) > from);
      if (from > this.sequence || missed.length !== this.sequence - from) {
        const why =
          from > this.sequence ? `is ahead of this worker's ${this.sequence} (it restarted)` : 'is no longer kept';
        call.emit('error', {
          code: grpc.status.OUT_OF_RANGE,
          details: `sequence ${from} ${why}: subscribe from 0 for the current state`,
        });
        return;
      }
      for (const batch of missed) call.write(batch);
    }
    this.subscribers.add(call);
    const drop = () => this.subscribers.delete(call);
    call.on('cancelled', drop);
    call.on('close', drop);
  }

  close() {
    this._unlisten();
    for (const call of this.subscribers) call.end();
    this.subscribers.clear();
  }
}

module.exports = { KvEventStream, kvCacheEvent };
