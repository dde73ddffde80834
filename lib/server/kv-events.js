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
 * The blocks and when they are stored and removed are ./kv-blocks.js's (the event source it shares
 * with the gRPC worker's `SubscribeKvEvents`). A subscriber that joins late gets
 * a replay of the current state, to it alone, under the last sequence number sent:
 * AllBlocksCleared (dropping what an earlier process on this address told it), then every block
 * held. Live batches carry sequence numbers 1, 2, ...
 */

const os = require('node:os');
const { encode } = require('@msgpack/msgpack');
const { PubSocket } = require('./zmtp');
const { KvBlockLedger, blockHashes, BLOCK_SIZE } = require('./kv-blocks');

const FORMATS = ['map', 'array'];
/** What a map's `token_ids` hold at an image's positions (the image is named by `extra_keys`). */
const IMAGE_POSITION_TOKEN = 0;

/** A ledger event in vLLM's map form (the default) or its earlier positional form. */
function encodeEvent(event, format) {
  if (event.type === 'removed') {
    if (format === 'array') return ['BlockRemoved', event.hashes, event.medium];
    return { type: 'BlockRemoved', block_hashes: event.hashes, medium: event.medium, group_idx: 0 };
  }
  const tokens = event.blocks.flatMap((b) => b.tokens);
  if (format === 'array') return ['BlockStored', event.hashes, event.parent, tokens, BLOCK_SIZE, null, event.medium];
  const extraKeys = event.blocks.some((b) => b.images) ? event.blocks.map((b) => b.images) : null;
  return {
    type: 'BlockStored',
    block_hashes: event.hashes,
    parent_block_hash: event.parent,
    token_ids: extraKeys ? tokens.map((t) => (t < 0 ? IMAGE_POSITION_TOKEN : t)) : tokens,
    block_size: BLOCK_SIZE,
    lora_id: null,
    medium: event.medium,
    lora_name: null,
    ...(extraKeys ? { extra_keys: extraKeys } : {}),
    group_idx: 0,
    kv_cache_spec_kind: 'full_attention',
  };
}

class KvEventPublisher {
  /**
   * @param {{ watchCache: Function }} scheduler
   * @param {{ model: string, pod?: string, format?: 'map' | 'array', ledger?: KvBlockLedger }} options
   *   the topic's parts (pod: POD_NAME, else the host name), the events' encoding, and the ledger
   *   to publish (default: one of the scheduler's own, closed with the publisher)
   */
  constructor(scheduler, { model, pod = process.env.POD_NAME || os.hostname(), format = 'map', ledger = null }) {
    if (!FORMATS.includes(format))
      throw new TypeError(`the KV event format must be ${FORMATS.join(' or ')}, got ${JSON.stringify(format)}`);
    this.format = format;
    this.topic = Buffer.from(`kv@${pod}@${model}`);
    this._ownsLedger = !ledger;
    this._ledger = ledger || new KvBlockLedger(scheduler);
    this._seq = 0n;
    this._socket = new PubSocket({ onSubscribe: (peer, topic) => this._replay(peer, topic) });
    this._unlisten = this._ledger.listen((events) => this._publish(events.map((e) => encodeEvent(e, format))));
  }

  /** The sequence number of the last batch published (0: none yet). */
  get sequence() {
    return Number(this._seq);
  }

  /** Binds the socket; resolves with the bound address. */
  bind(endpoint) {
    return this._socket.bind(endpoint);
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
    for (const stored of this._ledger.snapshot()) events.push(encodeEvent(stored, this.format));
    peer.send(this._message(events, this._seq), true);
  }

  async close() {
    this._unlisten();
    if (this._ownsLedger) this._ledger.close();
    await this._socket.close();
  }
}

module.exports = { KvEventPublisher, blockHashes, KV_EVENT_FORMATS: FORMATS };
