'use strict';

/**
 * `serve --grpc-port P`: a gRPC worker for SMG (the Shepherd Model Gateway, PyPI `smg`), beside
 * the HTTP server and over the same Scheduler. It speaks SMG's vLLM engine service
 * (`vllm.grpc.engine.VllmEngine`, ./proto/vllm-engine.proto): SMG finds the runtime by calling
 * each engine's HealthCheck, and subscribes to KV events only for vLLM, SGLang, TRT-LLM and
 * TokenSpeed workers — not the minimal MLX service — so exact, event-driven cache-aware routing
 * takes this one. Served: Generate (streamed or whole), Abort, HealthCheck, GetModelInfo,
 * GetServerInfo, GetLoads, GetTokenizer (the model's tokenizer as Hugging Face files, built from
 * the GGUF, ./hf-tokenizer.js: SMG tokenizes itself and reads no GGUF) and SubscribeKvEvents
 * (./kv-stream.js, from the ledger `--kv-events` publishes). The rest of the service (Embed,
 * FlushCache, profiling) answers UNIMPLEMENTED, as grpc-js does for methods not served.
 *
 * SMG sends token ids (its own tokenization and chat template): they are prefilled as they are,
 * so the blocks the KV events name are the ids SMG hashes. docs/deployment.md has the commands.
 */

const fs = require('node:fs');
const path = require('node:path');
const { createHash } = require('node:crypto');
const { Worker } = require('node:worker_threads');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { KvEventStream } = require('./kv-stream');
const { specialIdsOf, TokenizerErrorCode } = require('./hf-tokenizer');
const { generateOf, statusOf } = require('./grpc-generate');
const { BLOCK_SIZE } = require('./kv-blocks');
const { makeError } = require('../errors');
const defaults = require('../defaults');
const { version } = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'package.json'), 'utf8'));

const PROTO = path.join(__dirname, 'proto', 'vllm-engine.proto');
const TOKENIZER_CHUNK = 1 << 20; // under tonic's 4 MiB message limit

function engineService() {
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, defaults: true, oneofs: true });
  return /** @type {any} */ (grpc.loadPackageDefinition(definition)).vllm.grpc.engine.VllmEngine.service;
}

class GrpcWorker {
  /**
   * @param {{ scheduler: any, ctx: any, modelName: string, modelPath?: string, ledger: any,
   *   parallel: number, chatTemplate?: string }} parts
   */
  constructor({ scheduler, ctx, modelName, modelPath, ledger, parallel, chatTemplate }) {
    this.scheduler = scheduler;
    this.ctx = ctx;
    this.modelName = modelName;
    this.modelPath = modelPath ? path.resolve(modelPath) : '';
    this.parallel = parallel;
    this.chatTemplate = chatTemplate;
    this.closed = false;
    this.started = Date.now();
    /** Requests in flight by SMG's request id: their AbortControllers. */
    this.requests = new Map();
    this.kvStream = new KvEventStream(ledger);
    // The ids GetModelInfo reports; the vocabulary itself is read only when GetTokenizer asks.
    this.specialIds = this.modelPath ? specialIdsOf(this.modelPath) : null;
    this._tokenizerZip = null;
    this.server = new grpc.Server();
    this.server.addService(engineService(), this._handlers());
  }

  /** Binds `host:port` (port 0 picks one); resolves with the bound port. */
  bind(host, port) {
    const shown = host.includes(':') ? `[${host}]` : host;
    return new Promise((resolve, reject) =>
      this.server.bindAsync(`${shown}:${port}`, grpc.ServerCredentials.createInsecure(), (err, bound) =>
        err ? reject(err) : resolve(bound),
      ),
    );
  }

  _handlers() {
    const unary = (fn) => (call, callback) => {
      try {
        callback(null, fn(call.request));
      } catch (e) {
        callback(statusOf(e));
      }
    };
    return {
      Generate: (call) => generateOf(this, call),
      HealthCheck: unary(() => this._health()),
      Abort: unary((req) => this._abort(req.request_ids)),
      GetModelInfo: unary(() => this._modelInfo()),
      GetServerInfo: unary(() => this._serverInfo()),
      GetLoads: unary(() => this._loads()),
      GetTokenizer: (call) => this._sendTokenizer(call),
      SubscribeKvEvents: (call) => this.kvStream.subscribe(call),
    };
  }

  _health() {
    if (this.closed) return { healthy: false, message: 'shutting down' };
    if (this.ctx.lost) return { healthy: false, message: 'the context was lost (its RPC server died)' };
    return { healthy: true, message: 'ok' };
  }

  _abort(ids) {
    for (const id of ids) this.requests.get(id)?.abort();
    return {};
  }

  _modelInfo() {
    const v = this.specialIds;
    const id = (x) => (x === null || x === undefined ? -1 : x);
    return {
      // A path SMG cannot load as a tokenizer (a GGUF), so that it asks GetTokenizer.
      model_path: this.modelPath || this.modelName,
      is_generation: true,
      max_context_length: this.ctx.nCtx,
      vocab_size: this.ctx.vocabSize,
      supports_vision: Boolean(this.ctx.hasProjector),
      served_model_name: this.modelName,
      tokenizer_path: '',
      model_type: 'llama-branch',
      eos_token_ids: v && v.eos !== null ? [v.eos] : [],
      pad_token_id: id(v && v.pad),
      bos_token_id: id(v && v.bos),
      max_req_input_len: this.ctx.nCtx,
    };
  }

  _serverInfo() {
    return {
      active_requests: this.requests.size,
      is_paused: false,
      last_receive_timestamp: Date.now() / 1000,
      uptime_seconds: (Date.now() - this.started) / 1000,
      server_type: 'llama-branch-grpc',
      data_parallel_size: 1,
      kv_cache_dtype: this.ctx.typeK,
      block_size: BLOCK_SIZE,
      max_num_seqs: this.parallel,
    };
  }

  _loads() {
    const s = this.scheduler.stats();
    const load = {
      dp_rank: 0,
      num_running_reqs: s.running,
      num_waiting_reqs: s.queued,
      num_total_reqs: s.running + s.queued,
      // Cells running work holds: idle cached prefixes are reclaimable, not load (as vLLM and
      // SGLang count theirs). Counted in, a warm cache reads as overload and SMG routes away
      // from the replicas that hold a session's history.
      num_used_tokens: s.cellsInUse,
      max_total_num_tokens: s.nCtx,
      token_usage: s.nCtx > 0 ? s.cellsInUse / s.nCtx : 0,
      cache_hit_rate: s.hitRate,
      max_running_requests: this.parallel,
    };
    return { timestamp: new Date().toISOString(), version, dp_rank_count: 1, loads: [load] };
  }

  /** The tokenizer zip, built once off the event loop (a 262k-token vocabulary takes seconds). */
  tokenizerZip() {
    if (!this._tokenizerZip) {
      const workerData = { modelPath: this.modelPath, chatTemplate: this.chatTemplate, maxLength: this.ctx.nCtx };
      this._tokenizerZip = new Promise((resolve, reject) => {
        const worker = new Worker(path.join(__dirname, 'hf-tokenizer-worker.js'), { workerData });
        worker.once('message', (m) =>
          m.error ? reject(makeError(m.error.code, m.error.message)) : resolve(Buffer.from(m.zip)),
        );
        worker.once('error', reject);
      });
      this._tokenizerZip.catch(() => (this._tokenizerZip = null)); // a failure is not kept
    }
    return this._tokenizerZip;
  }

  async _sendTokenizer(call) {
    try {
      if (!this.modelPath)
        throw makeError(TokenizerErrorCode.UNSUPPORTED, 'this worker has no GGUF path to read a tokenizer from');
      const zip = await this.tokenizerZip();
      const sha256 = createHash('sha256').update(zip).digest('hex');
      for (let at = 0; at < zip.length; at += TOKENIZER_CHUNK) {
        const last = at + TOKENIZER_CHUNK >= zip.length;
        call.write({ data: zip.subarray(at, at + TOKENIZER_CHUNK), sha256: last ? sha256 : '' });
      }
      call.end();
    } catch (e) {
      call.emit('error', statusOf(e));
    }
  }

  async close() {
    this.closed = true;
    for (const controller of this.requests.values()) controller.abort();
    this.kvStream.close();
    // Streams still open after a second (a router's Generate or subscription) are cut.
    const forced = setTimeout(() => this.server.forceShutdown(), 1000);
    await new Promise((resolve) => this.server.tryShutdown(() => resolve()));
    clearTimeout(forced);
  }
}

/**
 * With `options.grpcPort` (0 picks one), the gRPC worker bound on `options.grpcHost` (default:
 * the HTTP server's default host): `{ worker, port, address }`; null without. A failed bind
 * closes it.
 * @param {any} options @param {ConstructorParameters<typeof GrpcWorker>[0]} parts
 */
async function grpcWorkerOf(options, parts) {
  const { grpcPort: port, grpcHost: host = defaults.server.host } = options;
  if (port === undefined || port === null) return null;
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw makeError('ERR_INVALID_ARG', `options.grpcPort must be a port number (0..65535; 0 picks one), got ${port}`);
  if (typeof host !== 'string' || host === '')
    throw makeError('ERR_INVALID_ARG', `options.grpcHost must be a host name or address, got ${host}`);
  const worker = new GrpcWorker({ ...parts, modelPath: options.modelPath, chatTemplate: options.chatTemplate });
  try {
    const bound = await worker.bind(host, port);
    return { worker, port: bound, address: `grpc://${host.includes(':') ? `[${host}]` : host}:${bound}` };
  } catch (e) {
    await worker.close();
    throw makeError('ERR_INVALID_ARG', `options.grpcPort: cannot listen on ${host}:${port}: ${e.message}`);
  }
}

module.exports = { GrpcWorker, grpcWorkerOf, engineService, PROTO };
