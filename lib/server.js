'use strict';

/**
 * An OpenAI-compatible HTTP server over a Scheduler (node:http only):
 *   POST /v1/completions, POST /v1/chat/completions (non-streaming or server-sent events; tool
 *   calls and logprobs), POST /v1/embeddings (with a pooled context), GET /v1/models,
 *   POST /v1/systemone and POST /v1/decisions (typed decisions in System One's and OpenAI's
 *   formats, lib/server/{systemone,decisions}.js), GET /metrics (Prometheus text), GET /health
 *   (status plus the scheduler's stats; never keyed),
 *   GET /v1/events (the scheduler's events as server-sent events, docs/events.md) and the page
 *   that draws them at / (static files of lib/server/ui, never keyed; the data they fetch is).
 * Every request error is an OpenAI-style `{ error: { message, type, param, code } }` with a 4xx
 * status; nothing a client sends can stop the server. A client that disconnects aborts its
 * request (its branches are freed within one scheduler step).
 */

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { randomUUID, createHash, timingSafeEqual } = require('node:crypto');
const { Scheduler } = require('./Scheduler');
const { makeError } = require('./errors');
const {
  HttpError,
  toHttpError,
  errorBody,
  sendJson,
  sendError,
  readJsonBody,
  abortOnDisconnect,
} = require('./server/http');
const { generateRequest, usageOf, ENDPOINTS } = require('./server/openai');
const { Metrics } = require('./server/metrics');
const { Embedder } = require('./server/embeddings');
const { EventFeed } = require('./server/events');
const { uiRoutes } = require('./server/ui');
const { systemoneRoute } = require('./server/systemone');
const { decisionsRoute } = require('./server/decisions');
const { KvEventPublisher, KV_EVENT_FORMATS } = require('./server/kv-events');
const { KvBlockLedger } = require('./server/kv-blocks');
const { grpcWorkerOf } = require('./server/grpc');

const defaults = require('./defaults');
const { PoolingType } = require('./constants');

const isInt = (v) => Number.isInteger(v);
/** OpenAI's `system_fingerprint` (a string where present): the backend, named by its version. */
const PACKAGE_JSON = path.join(__dirname, '..', 'package.json');
const FINGERPRINT = `llama-branch-${JSON.parse(fs.readFileSync(PACKAGE_JSON, 'utf8')).version}`;

/**
 * Streams a generation as server-sent events. The first event (or the error) decides the status,
 * so that a request the scheduler refuses (queue full, bad grammar) still gets a 4xx with an
 * error body; an error after that ends the stream with an error event.
 */
async function streamGeneration(res, gen, { shape, head, n, includeUsage, tokenText, headers }) {
  const events = gen[Symbol.asyncIterator]();
  let first;
  try {
    first = await events.next();
  } catch (e) {
    sendError(res, e);
    return 200; // counted by the caller from the error
  }
  res.writeHead(200, {
    ...headers,
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
  });
  const chunkHead = { ...head, object: shape.chunkObject };
  const send = (payload) => res.write(`data: ${JSON.stringify(payload)}\n\n`);
  if (shape.opening) for (let i = 0; i < n; i++) send({ ...chunkHead, choices: [shape.opening(i)] });
  const offsets = new Array(n).fill(0);
  try {
    for (let step = first; !step.done; step = await events.next()) {
      if (step.value.finishReason === 'abort') continue;
      const choice = shape.chunk(step.value, tokenText, offsets);
      if (choice) send({ ...chunkHead, choices: [choice] });
    }
    const result = await gen;
    if (includeUsage) send({ ...chunkHead, choices: [], usage: usageOf(result.usage) });
    res.end('data: [DONE]\n\n');
  } catch (e) {
    send(errorBody(toHttpError(e)));
    res.end();
  }
  return 200;
}

/** GET /v1/models/<id>, or the 404 or 405 (with `Allow`) a path without a route gets. */
function unrouted(method, pathname, routes, res, modelCard) {
  if (pathname.startsWith('/v1/models/') && method === 'GET') {
    const id = decodeURIComponent(pathname.slice('/v1/models/'.length));
    if (id === modelCard.id) return sendJson(res, 200, modelCard);
    throw new HttpError(404, `The model \`${id}\` does not exist`, { param: 'model', code: 'model_not_found' });
  }
  const allowed = Object.keys(routes)
    .filter((r) => r.endsWith(` ${pathname}`))
    .map((r) => r.split(' ')[0]);
  if (allowed.length > 0) {
    throw new HttpError(405, `${method} is not allowed on ${pathname}; use ${allowed.join(' or ')}`, {
      headers: { allow: allowed.join(', ') },
    });
  }
  throw new HttpError(
    404,
    `no route ${method} ${pathname}; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings, POST /v1/systemone, POST /v1/decisions, GET /v1/events, GET /metrics, GET /health`,
  );
}

/** SHA-256 digests of the accepted keys: compared in constant time whatever a key's length. */
function keyDigests(keys) {
  return keys.map((k) => createHash('sha256').update(k).digest());
}

/** Throws the 401 of a request without one of the server's keys (no keys: everyone may). */
function checkKey(req, digests) {
  if (digests.length === 0) return;
  const header = req.headers.authorization || '';
  const match = /^Bearer\s+(.+)$/i.exec(header);
  const given = createHash('sha256')
    .update(match ? match[1].trim() : '')
    .digest();
  let ok = false;
  for (const d of digests) ok = timingSafeEqual(d, given) || ok; // no early exit
  if (ok) return;
  throw new HttpError(
    401,
    match
      ? "Incorrect API key provided; pass one of the server's --api-key values as Authorization: Bearer KEY"
      : 'Missing API key: this server needs Authorization: Bearer KEY (one of its --api-key values)',
    { code: 'invalid_api_key', headers: { 'www-authenticate': 'Bearer' } },
  );
}

/**
 * Answers one /v1/completions or /v1/chat/completions request (`app`: what createApp set up).
 * The client going away before the response is complete aborts the generation.
 */
async function generateEndpoint(app, kind, req, res) {
  const body = await readJsonBody(req, app.maxBodyBytes);
  const request = generateRequest(kind, body, app.env);
  const signal = abortOnDisconnect(res);
  request.signal = signal;
  const gen = app.scheduler.generate(request);
  const shape = ENDPOINTS[kind];
  const head = {
    id: shape.idPrefix + randomUUID(),
    object: shape.object,
    created: Math.floor(Date.now() / 1000),
    model: app.env.modelName,
    system_fingerprint: FINGERPRINT,
  };
  const { tokenText, corsHeaders } = app;
  if (body.stream) {
    const includeUsage = Boolean(body.stream_options && body.stream_options.include_usage);
    const n = request.n || 1;
    await streamGeneration(res, gen, { shape, head, n, includeUsage, tokenText, headers: corsHeaders });
    return;
  }
  const result = await gen;
  if (signal.aborted) return;
  const choices = result.choices.map((c, i) => shape.choice(c, i, tokenText));
  sendJson(res, 200, { ...head, choices, usage: usageOf(result.usage) }, corsHeaders);
}

/** The routes of an app, by `METHOD /path`. */
function routesOf(app) {
  const { scheduler, metrics, corsHeaders, modelCard, feed } = app;
  return {
    ...(app.ui ? uiRoutes() : {}),
    'GET /v1/events': (req, res) => feed.attach(req, res, corsHeaders),
    'GET /health': (req, res) => {
      // While the context compiles its GPU pipelines (lib/warmup.js) requests are served, but
      // the first one of each batch size may stall: 503 tells load balancers to wait, as
      // llama.cpp's server does while it loads.
      const { state, done, total, ms } = app.ctx.warmup;
      const warming = state === 'warming';
      sendJson(res, warming ? 503 : 200, {
        status: warming ? 'warming up' : 'ok',
        model: modelCard.id,
        warmup: { state, done, total, ms },
        ...scheduler.stats(),
      });
    },
    'GET /metrics': (req, res) => {
      const text = metrics.render(scheduler.stats());
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', ...corsHeaders });
      res.end(text);
    },
    'GET /v1/models': (req, res) => sendJson(res, 200, { object: 'list', data: [modelCard] }, corsHeaders),
    ...workerInfoRoutes(app),
    'POST /v1/completions': (req, res) => generateEndpoint(app, 'completions', req, res),
    'POST /v1/chat/completions': (req, res) => generateEndpoint(app, 'chat', req, res),
    'POST /v1/systemone': systemoneRoute(app),
    'POST /v1/decisions': decisionsRoute(app),
    'POST /v1/embeddings': async (req, res) => {
      const body = await readJsonBody(req, app.maxBodyBytes);
      const response = await app.embedder.respond(body, modelCard.id);
      metrics.embeddingInputs += response.data.length;
      sendJson(res, 200, response, corsHeaders);
    },
  };
}

/**
 * What SGLang's model gateway (`sglang-router`) reads from a worker when it registers it: GET
 * /server_info and /model_info (and the older /get_server_info and /get_model_info it falls back
 * to on a 404). It labels the worker with the model's name from them; without them it registers
 * the worker under "unknown". `model_path` is the served name, never a path of this machine.
 */
function workerInfoRoutes(app) {
  const { modelCard, corsHeaders } = app;
  const serverInfo = (req, res) =>
    sendJson(
      res,
      200,
      {
        model_path: modelCard.id,
        served_model_name: modelCard.id,
        tp_size: 1,
        dp_size: 1,
        version: FINGERPRINT,
        max_running_requests: app.parallel,
        max_total_tokens: app.ctx.nCtx,
      },
      corsHeaders,
    );
  const modelInfo = (req, res) =>
    sendJson(res, 200, { model_path: modelCard.id, tokenizer_path: null, is_generation: true }, corsHeaders);
  return {
    'POST /tokenize': (req, res) => tokenizeRoute(app, req, res),
    'GET /server_info': serverInfo,
    'GET /get_server_info': serverInfo,
    'GET /model_info': modelInfo,
    'GET /get_model_info': modelInfo,
  };
}

/**
 * vLLM's `POST /tokenize` (`{ prompt }` or `{ messages }` → `{ count, max_model_len, tokens }`):
 * the tokens the request would be prefilled with, chat template included. vllm-router's
 * `kv_aware` policy asks a worker for them and matches them against the KV event stream.
 */
async function tokenizeRoute(app, req, res) {
  const body = await readJsonBody(req, app.maxBodyBytes);
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError(400, 'the body must be a JSON object with prompt or messages');
  const kind = body.messages !== undefined ? 'chat' : 'completions';
  const request = generateRequest(kind, { ...body, max_tokens: 1, stream: false }, app.env);
  const tokens = await app.scheduler.promptTokens(request);
  sendJson(res, 200, { count: tokens.length, max_model_len: app.ctx.nCtx, tokens, token_strs: null }, app.corsHeaders);
}

/** CORS preflight: the origin given with --cors may send JSON with a bearer key. */
function preflight(res, corsHeaders) {
  res.writeHead(204, {
    ...corsHeaders,
    'access-control-allow-methods': 'GET, POST, OPTIONS',
    'access-control-allow-headers': 'authorization, content-type',
    'access-control-max-age': '600',
  });
  res.end();
}

/**
 * What the model takes and gives, in the model card: OpenRouter's `architecture.input_modalities`
 * and llama.cpp server's `modalities` (images with a projector, `--mmproj`).
 */
function modalitiesOf(ctx) {
  const vision = Boolean(ctx.hasProjector);
  return {
    architecture: { input_modalities: vision ? ['text', 'image'] : ['text'], output_modalities: ['text'] },
    modalities: { vision, audio: false },
  };
}

/** Builds the HTTP app around a scheduler: keys, CORS and metrics around every route. */
function createApp(config) {
  const { ctx, modelName, apiKeys, cors, limits, reasoningFormat, metrics } = config;
  const created = Math.floor(Date.now() / 1000);
  const app = {
    ...config,
    modelCard: { id: modelName, object: 'model', created, owned_by: 'llama-branch', ...modalitiesOf(ctx) },
    env: { modelName, bosToken: ctx.getBosToken(), reasoningFormat, limits, vision: ctx.hasProjector },
    corsHeaders: cors ? { 'access-control-allow-origin': cors, vary: 'origin' } : {},
    tokenText: (token) => ctx.tokenToText(token),
  };
  const digests = keyDigests(apiKeys);
  app.checkKey = (req) => checkKey(req, digests);
  const routes = routesOf(app);
  return async function handle(req, res) {
    let endpoint = 'other';
    res.on('finish', () => metrics.request(endpoint, res.statusCode));
    try {
      const { pathname } = new URL(req.url, 'http://localhost');
      const key = `${req.method} ${pathname.replace(/\/+$/, '') || '/'}`;
      const route = routes[key];
      if (route) endpoint = key.split(' ')[1];
      if (cors && req.method === 'OPTIONS') return preflight(res, app.corsHeaders);
      if (pathname !== '/health' && !(route && route.public)) checkKey(req, digests);
      if (route) await route(req, res);
      else unrouted(req.method, pathname, routes, res, app.modelCard);
    } catch (e) {
      sendError(res, e, app.corsHeaders);
    }
  };
}

/** The API keys of `options.apiKeys` (a string or an array of them), checked. */
function apiKeysOf(option) {
  const keys = option === undefined || option === null ? [] : typeof option === 'string' ? [option] : option;
  if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'string' && k.length > 0))
    throw makeError('ERR_INVALID_ARG', 'options.apiKeys must be a non-empty string or an array of them');
  return keys;
}

/**
 * Creates the server on `options.ctx`, or on contexts it opens with `createContext` (the
 * package's, given by lib/index.js: this file never requires the package entry, which requires
 * it) from `options.modelPath`. See ServerOptions in index.d.ts.
 * @param {any} options
 * @param {(options: any) => Promise<any>} createContext
 */
async function createServer(options, createContext) {
  if (options === null || typeof options !== 'object')
    throw makeError('ERR_INVALID_ARG', 'createServer(options): expected { ctx } or { modelPath }');
  if (!options.ctx === !options.modelPath)
    throw makeError('ERR_INVALID_ARG', 'createServer(options): give exactly one of ctx or modelPath');
  const parallel = options.parallel === undefined ? defaults.server.parallel : options.parallel;
  if (!isInt(parallel) || parallel < 1)
    throw makeError('ERR_INVALID_ARG', `options.parallel must be a positive integer, got ${parallel}`);
  const config = serverConfig(options);
  const owned = [];
  try {
    let ctx = options.ctx;
    if (!ctx) {
      ctx = await openContext(createContext, options, {
        nCtx: options.nCtx === undefined ? defaults.server.nCtx : options.nCtx,
        nSeqMax: options.nSeqMax === undefined ? defaults.serverSeqMax(parallel) : options.nSeqMax,
      });
      owned.push(ctx);
    }
    const embeddingsCtx = await embeddingsContextOf(createContext, options, owned);
    const speculative = await speculativeOf(createContext, options, ctx, parallel, owned);
    const metrics = new Metrics();
    const userOnStep = options.scheduler && options.scheduler.onStep;
    const onStep = (info) => {
      metrics.step(info);
      if (userOnStep) userOnStep(info);
    };
    const scheduler = new Scheduler(ctx, {
      maxRunning: parallel,
      ...(speculative ? { speculative } : {}),
      ...options.scheduler,
      onStep,
    });
    const embedder = new Embedder(embeddingsCtx);
    const modelName =
      options.modelName ||
      (options.modelPath ? path.basename(String(options.modelPath)).replace(/\.gguf$/i, '') : 'llama-branch');
    const feed = new EventFeed(scheduler, { model: modelName, ctx, traceFile: config.traceFile });
    const app = createApp({ scheduler, ctx, modelName, metrics, embedder, feed, parallel, ...config });
    // One ledger of KV blocks feeds both streams: --kv-events' ZeroMQ and the gRPC worker's.
    const wanted = (v) => v !== undefined && v !== null;
    const ledger = wanted(options.kvEvents) || wanted(options.grpcPort) ? new KvBlockLedger(scheduler) : null;
    const kvEvents = await kvEventsOf(options, scheduler, modelName, ledger);
    const grpc = await grpcWorkerOf(options, { scheduler, ctx, modelName, ledger, parallel }).catch(async (e) => {
      if (kvEvents) await kvEvents.publisher.close();
      throw e;
    });
    const streams = { kvEvents, grpc, ledger };
    return listening(http.createServer(app), { ctx, scheduler, modelName, owned, feed, ...streams });
  } catch (e) {
    for (const c of owned) c.dispose();
    throw e;
  }
}

/**
 * With `options.kvEvents` (`tcp://HOST:PORT`), the publisher of the prefix cache's KV events
 * (lib/server/kv-events.js) in `options.kvEventsFormat` ('map', the default, or 'array'), bound;
 * null without. A failed bind closes it (pushed to `owned` only once bound, so that
 * createServer's cleanup disposes of contexts alone).
 */
async function kvEventsOf({ kvEvents: endpoint, kvEventsFormat: format = 'map' }, scheduler, modelName, ledger) {
  if (!KV_EVENT_FORMATS.includes(format))
    throw makeError(
      'ERR_INVALID_ARG',
      `options.kvEventsFormat must be 'map' or 'array', got ${JSON.stringify(format)}`,
    );
  if (endpoint === undefined || endpoint === null) return null;
  if (typeof endpoint !== 'string' || !/^tcp:\/\/(\[[^\]]+\]|[^:/]+):\d+$/.test(endpoint))
    throw makeError('ERR_INVALID_ARG', `options.kvEvents must be tcp://HOST:PORT (port 0 picks one), got ${endpoint}`);
  const publisher = new KvEventPublisher(scheduler, {
    model: modelName,
    format: /** @type {'map' | 'array'} */ (format),
    ledger,
  });
  try {
    const address = await publisher.bind(endpoint);
    return { publisher, address, topic: publisher.topic.toString() };
  } catch (e) {
    await publisher.close();
    throw makeError('ERR_INVALID_ARG', `options.kvEvents: cannot listen on ${endpoint}: ${e.message}`);
  }
}

/** The server's options beyond its contexts, checked, defaults filled in. */
function serverConfig(options) {
  const pick = (name, fallback) => (options[name] === undefined ? fallback : options[name]);
  const limits = {
    maxTokens: pick('maxTokensLimit', defaults.server.maxTokensLimit),
    maxN: pick('maxN', defaults.server.maxN),
    maxQuestions: pick('maxQuestions', defaults.server.maxQuestions),
  };
  for (const [name, v] of [
    ['maxTokensLimit', limits.maxTokens],
    ['maxN', limits.maxN],
    ['maxQuestions', limits.maxQuestions],
  ]) {
    if (!isInt(v) || v < 1) throw makeError('ERR_INVALID_ARG', `options.${name} must be a positive integer, got ${v}`);
  }
  const cors = pick('cors', null);
  if (cors !== null && (typeof cors !== 'string' || cors === ''))
    throw makeError('ERR_INVALID_ARG', 'options.cors must be an origin (e.g. "https://example.com") or "*"');
  return {
    maxBodyBytes: pick('maxBodyBytes', defaults.server.maxBodyBytes),
    apiKeys: apiKeysOf(options.apiKeys),
    cors,
    limits,
    reasoningFormat: pick('reasoningFormat', defaults.server.reasoningFormat),
    ui: checkBoolean(pick('ui', true), 'ui'),
    traceFile: checkTraceFile(pick('traceFile', null)),
  };
}

function checkBoolean(value, name) {
  if (typeof value !== 'boolean') throw makeError('ERR_INVALID_ARG', `options.${name} must be true or false`);
  return value;
}

/** `options.traceFile`: null, or a path whose folder exists (checked now, not at the first event). */
function checkTraceFile(file) {
  if (file === null) return null;
  if (typeof file !== 'string' || file === '')
    throw makeError('ERR_INVALID_ARG', 'options.traceFile must be the path of a file to write the trace to');
  const dir = path.dirname(path.resolve(file));
  if (!fs.existsSync(dir)) throw makeError('ERR_INVALID_ARG', `options.traceFile: the folder ${dir} does not exist`);
  return file;
}

/**
 * The pooled context behind /v1/embeddings: `options.embeddingsCtx`, or with `options.embeddings`
 * one the server opens on `modelPath` and owns (pushed to `owned`); null when there is none.
 */
async function embeddingsContextOf(createContext, options, owned) {
  if (options.embeddingsCtx) return options.embeddingsCtx;
  if (!options.embeddings) return null;
  if (!options.modelPath)
    throw makeError(
      'ERR_INVALID_ARG',
      'options.embeddings with options.ctx: pass embeddingsCtx instead (a context created with embeddings: true)',
    );
  const size = defaults.server.embeddingsCtx;
  const ctx = await openContext(createContext, options, {
    embeddings: true,
    nCtx: size,
    nBatch: size,
    nSeqMax: defaults.server.embeddingsBatch,
    poolingType: PoolingType.MEAN,
  });
  owned.push(ctx);
  return ctx;
}

/**
 * The scheduler's `speculative` option from `options.speculative`: `'lookup'`, or `'draft'` with
 * `modelDraft` (a context the server opens on it and owns: three sequences per line that may
 * speculate), with `specMaxDraft`; null when off.
 */
async function speculativeOf(createContext, options, ctx, parallel, owned) {
  const kind = options.speculative;
  if (kind === undefined || kind === null || kind === false || kind === 'none') return null;
  const maxDraft = options.specMaxDraft === undefined ? defaults.server.specMaxDraft : options.specMaxDraft;
  if (kind === 'lookup') return { lookup: true, maxDraft };
  if (kind !== 'draft')
    throw makeError('ERR_INVALID_ARG', `options.speculative must be 'lookup', 'draft' or 'none', got ${kind}`);
  if (typeof options.modelDraft !== 'string' || options.modelDraft === '')
    throw makeError(
      'ERR_INVALID_ARG',
      "options.speculative 'draft' needs modelDraft: the path of a smaller model with the same vocabulary",
    );
  const draftCtx = await createContext({
    modelPath: options.modelDraft,
    nThreads: options.nThreads,
    ...contextOptions(options),
    nCtx: ctx.nCtx,
    nSeqMax: Math.min(defaults.server.maxSeqMax, 3 * parallel * defaults.server.draftLinesPerRequest),
  });
  owned.push(draftCtx);
  return { draft: draftCtx, maxDraft };
}

/**
 * The options of createContext the server passes to every context it loads (those given): where
 * they run, how their KV cache is stored and whether their logits are batch-invariant.
 */
function contextOptions(options) {
  const picked = {};
  for (const k of ['gpu', 'nGpuLayers', 'typeK', 'typeV', 'flashAttention', 'deterministic', 'warmup'])
    if (options[k] !== undefined) picked[k] = options[k];
  return picked;
}

/** A context the server creates (and disposes of on close) from `options.modelPath`. */
function openContext(createContext, options, shape) {
  const { modelPath, nThreads, chatTemplate, mmprojPath, imageMaxBytes, imageMaxPixels } = options;
  const images = { mmprojPath, imageMaxBytes, imageMaxPixels };
  for (const k of Object.keys(images)) if (images[k] === undefined) delete images[k];
  return createContext({
    modelPath,
    nThreads,
    ...(mmprojPath === undefined || shape.embeddings ? {} : images),
    ...contextOptions(options),
    ...(chatTemplate === undefined ? {} : { chatTemplate }),
    ...shape,
  });
}

/** The object createServer resolves with: listen, close, and what it serves. */
function listening(server, { ctx, scheduler, modelName, owned, feed, kvEvents, grpc, ledger }) {
  return {
    ctx,
    scheduler,
    modelName,
    http: server,
    /** With `kvEvents`: `{ address, topic, publisher }` of the KV event stream; null without. */
    kvEvents,
    /** With `grpcPort`: `{ address, port, worker }` of the gRPC worker for SMG; null without. */
    grpc,
    listen(port = defaults.server.port, host = defaults.server.host) {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          const address = /** @type {import('net').AddressInfo} */ (server.address());
          const shownHost = address.family === 'IPv6' ? `[${address.address}]` : address.address;
          resolve({ host: address.address, port: address.port, url: `http://${shownHost}:${address.port}` });
        });
      });
    },
    async close() {
      const closed = new Promise((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await scheduler.close();
      await feed.close();
      if (kvEvents) await kvEvents.publisher.close();
      if (grpc) await grpc.worker.close();
      if (ledger) ledger.close();
      await closed;
      for (const c of owned) c.dispose();
    },
  };
}

module.exports = { createServer };
