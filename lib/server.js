'use strict';

/**
 * An OpenAI-compatible HTTP server over a Scheduler (node:http only):
 *   POST /v1/completions, POST /v1/chat/completions (non-streaming or server-sent events),
 *   GET /v1/models, GET /health (status plus the scheduler's stats).
 * Every request error is an OpenAI-style `{ error: { message, type, param, code } }` with a 4xx
 * status; nothing a client sends can stop the server. A client that disconnects aborts its
 * request (its branches are freed within one scheduler step).
 */

const http = require('node:http');
const path = require('node:path');
const { randomUUID } = require('node:crypto');
const { Scheduler } = require('./Scheduler');
const { makeError } = require('./errors');

const defaults = require('./defaults');

/** An error with the HTTP status and OpenAI error fields it is answered with. */
class HttpError extends Error {
  constructor(status, message, { type = 'invalid_request_error', param = null, code = null } = {}) {
    super(message);
    this.status = status;
    this.type = type;
    this.param = param;
    this.errorCode = code;
  }
}

const badRequest = (message, param = null) => new HttpError(400, message, { param });

/** Package error codes a client can cause, and how they are answered. */
const CLIENT_ERRORS = {
  ERR_INVALID_ARG: [400, 'invalid_request_error'],
  ERR_GRAMMAR: [400, 'invalid_request_error'],
  ERR_CHAT_TEMPLATE: [400, 'invalid_request_error'],
  ERR_TOKENIZE: [400, 'invalid_request_error'],
  ERR_TOKEN_OUT_OF_RANGE: [400, 'invalid_request_error'],
  ERR_KV_FULL: [400, 'invalid_request_error'],
  ERR_QUEUE_FULL: [429, 'rate_limit_error'],
  ERR_SCHEDULER_CLOSED: [503, 'server_error'],
};

function toHttpError(e) {
  if (e instanceof HttpError) return e;
  const known = e && CLIENT_ERRORS[e.code];
  if (known)
    return new HttpError(known[0], e.message, { type: known[1], code: e.code.replace(/^ERR_/, '').toLowerCase() });
  return new HttpError(500, `internal error: ${e && e.message ? e.message : String(e)}`, { type: 'server_error' });
}

function sendJson(res, status, body) {
  if (res.headersSent) return;
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
  res.end(data);
}

function sendError(res, e) {
  const err = toHttpError(e);
  sendJson(res, err.status, { error: { message: err.message, type: err.type, param: err.param, code: err.errorCode } });
}

/** The JSON object body, or an HttpError (413 too large, 400 not a JSON object). */
function readJsonBody(req, maxBytes) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let failed = false;
    req.on('data', (chunk) => {
      if (failed) return;
      size += chunk.length;
      if (size > maxBytes) {
        failed = true;
        reject(new HttpError(413, `request body larger than ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('error', (e) => !failed && reject(new HttpError(400, `could not read the request body: ${e.message}`)));
    req.on('end', () => {
      if (failed) return;
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch (e) {
        reject(badRequest(`the request body is not valid JSON (${e.message})`));
        return;
      }
      if (body === null || typeof body !== 'object' || Array.isArray(body))
        reject(badRequest('the request body must be a JSON object'));
      else resolve(body);
    });
  });
}

// -------------------------------------------------------------------------------------------------
// OpenAI request fields → Scheduler request

function optionalNumber(body, name, check, what) {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !check(v)) throw badRequest(`${name} must be ${what}`, name);
  return v;
}

const isInt = (v) => Number.isInteger(v);

/** The fields both endpoints share: sampling, n, stop, seed, response_format. */
function commonRequest(body, maxTokensDefault) {
  const request = { params: {} };
  const temperature = optionalNumber(body, 'temperature', (v) => v >= 0 && v <= 2, 'a number in [0, 2]');
  if (temperature !== undefined) request.params.temperature = temperature;
  const topP = optionalNumber(body, 'top_p', (v) => v > 0 && v <= 1, 'a number in (0, 1]');
  if (topP !== undefined) request.params.topP = topP;
  const presence = optionalNumber(body, 'presence_penalty', (v) => v >= -2 && v <= 2, 'a number in [-2, 2]');
  const frequency = optionalNumber(body, 'frequency_penalty', (v) => v >= -2 && v <= 2, 'a number in [-2, 2]');
  if (presence || frequency) request.params.penalties = { presence: presence || 0, frequency: frequency || 0 };
  request.n = optionalNumber(body, 'n', (v) => isInt(v) && v >= 1 && v <= 16, 'an integer in [1, 16]');
  const maxTokens =
    body.max_completion_tokens !== undefined && body.max_completion_tokens !== null
      ? 'max_completion_tokens'
      : 'max_tokens';
  request.maxTokens =
    optionalNumber(body, maxTokens, (v) => isInt(v) && v >= 1, 'a positive integer') || maxTokensDefault;
  request.seed = optionalNumber(body, 'seed', (v) => isInt(v), 'an integer');
  if (request.seed !== undefined) request.seed = ((request.seed % 2 ** 32) + 2 ** 32) % 2 ** 32;
  const { stop } = body;
  if (stop !== undefined && stop !== null) {
    const stops = typeof stop === 'string' ? [stop] : stop;
    if (!Array.isArray(stops) || stops.length > 16 || !stops.every((s) => typeof s === 'string'))
      throw badRequest('stop must be a string or an array of at most 16 strings', 'stop');
    request.stop = stops;
  }
  const format = body.response_format;
  if (format !== undefined && format !== null) {
    if (typeof format !== 'object' || typeof format.type !== 'string')
      throw badRequest('response_format must be an object with a type', 'response_format');
    if (format.type === 'json_schema') {
      const schema = format.json_schema && format.json_schema.schema;
      if (!schema || typeof schema !== 'object')
        throw badRequest('response_format.json_schema.schema must be a JSON schema object', 'response_format');
      request.jsonSchema = schema;
    } else if (format.type === 'json_object') {
      request.jsonSchema = { type: 'object' };
    } else if (format.type !== 'text') {
      throw badRequest(
        `response_format.type must be text, json_object or json_schema, got ${format.type}`,
        'response_format',
      );
    }
  }
  return request;
}

function completionsPrompt(body) {
  let { prompt } = body;
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string') prompt = prompt[0];
  if (typeof prompt === 'string' && prompt !== '') return { prompt };
  if (Array.isArray(prompt) && prompt.length > 0 && prompt.every(isInt)) return { tokens: prompt };
  throw badRequest('prompt must be a non-empty string (or an array of token ids); one prompt per request', 'prompt');
}

/** OpenAI messages → ChatMessage[]: text content parts are joined; other parts are refused. */
function chatMessages(body) {
  const { messages } = body;
  if (!Array.isArray(messages) || messages.length === 0)
    throw badRequest('messages must be a non-empty array', 'messages');
  return messages.map((m, i) => {
    if (m === null || typeof m !== 'object' || typeof m.role !== 'string')
      throw badRequest(`messages[${i}] must be an object with a role`, 'messages');
    let content = m.content;
    if (Array.isArray(content)) {
      if (!content.every((p) => p && p.type === 'text' && typeof p.text === 'string'))
        throw badRequest(`messages[${i}].content: only text parts are supported`, 'messages');
      content = content.map((p) => p.text).join('');
    }
    if (content === null || content === undefined) content = '';
    if (typeof content !== 'string')
      throw badRequest(`messages[${i}].content must be a string or an array of text parts`, 'messages');
    return { role: m.role, content };
  });
}

function usageOf(usage) {
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.completionTokens,
    total_tokens: usage.promptTokens + usage.completionTokens,
    prompt_tokens_details: { cached_tokens: usage.cachedPromptTokens },
  };
}

/** The OpenAI shapes of one endpoint: a whole choice, and a streamed piece of one. */
const ENDPOINTS = {
  completions: {
    idPrefix: 'cmpl-',
    object: 'text_completion',
    chunkObject: 'text_completion',
    choice: (c, index) => ({ index, text: c.text, finish_reason: c.finishReason, logprobs: null }),
    delta: (index, text, finishReason) => ({ index, text, finish_reason: finishReason, logprobs: null }),
    opening: null,
  },
  chat: {
    idPrefix: 'chatcmpl-',
    object: 'chat.completion',
    chunkObject: 'chat.completion.chunk',
    choice: (c, index) => ({
      index,
      message: { role: 'assistant', content: c.text },
      finish_reason: c.finishReason,
      logprobs: null,
    }),
    delta: (index, text, finishReason) => ({
      index,
      delta: text === '' ? {} : { content: text },
      finish_reason: finishReason,
      logprobs: null,
    }),
    opening: (index) => ({ index, delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null }),
  },
};

// -------------------------------------------------------------------------------------------------
// The server

/** The Scheduler request of an OpenAI request `body` to endpoint `kind` ('completions' | 'chat'). */
function generateRequest(kind, body, modelName) {
  if (body.model !== undefined && body.model !== null && body.model !== modelName) {
    throw new HttpError(
      404,
      `The model \`${body.model}\` does not exist; this server serves \`${modelName}\` (GET /v1/models)`,
      { param: 'model', code: 'model_not_found' },
    );
  }
  const request = commonRequest(body, kind === 'completions' ? defaults.server.completionsMaxTokens : undefined);
  Object.assign(request, kind === 'chat' ? { messages: chatMessages(body) } : completionsPrompt(body));
  if (body.stream !== undefined && typeof body.stream !== 'boolean')
    throw badRequest('stream must be a boolean', 'stream');
  return request;
}

/**
 * Streams a generation as server-sent events. The first event (or the error) decides the status,
 * so that a request the scheduler refuses (queue full, bad grammar) still gets a 4xx with an
 * error body; an error after that ends the stream with an error event.
 */
async function streamGeneration(res, gen, { shape, head, n, includeUsage }) {
  const events = gen[Symbol.asyncIterator]();
  let first;
  try {
    first = await events.next();
  } catch (e) {
    sendError(res, e);
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  const chunkHead = { ...head, object: shape.chunkObject };
  const send = (payload) => res.write(`data: ${JSON.stringify(payload)}\n\n`);
  if (shape.opening) for (let i = 0; i < n; i++) send({ ...chunkHead, choices: [shape.opening(i)] });
  try {
    for (let step = first; !step.done; step = await events.next()) {
      const e = step.value;
      if (e.finishReason === 'abort') continue;
      if (e.text === '' && !e.finishReason) continue;
      send({ ...chunkHead, choices: [shape.delta(e.choice, e.text, e.finishReason || null)] });
    }
    const result = await gen;
    if (includeUsage) send({ ...chunkHead, choices: [], usage: usageOf(result.usage) });
    res.end('data: [DONE]\n\n');
  } catch (e) {
    const err = toHttpError(e);
    send({ error: { message: err.message, type: err.type, param: err.param, code: err.errorCode } });
    res.end();
  }
}

/** GET /v1/models/<id>, or the 404 or 405 a path without a route gets. */
function unrouted(method, pathname, routes, res, modelCard) {
  if (pathname.startsWith('/v1/models/') && method === 'GET') {
    const id = decodeURIComponent(pathname.slice('/v1/models/'.length));
    if (id === modelCard.id) return sendJson(res, 200, modelCard);
    throw new HttpError(404, `The model \`${id}\` does not exist`, { param: 'model', code: 'model_not_found' });
  }
  if (Object.keys(routes).some((r) => r.endsWith(` ${pathname}`))) {
    throw new HttpError(405, `${method} is not allowed on ${pathname}`);
  }
  throw new HttpError(
    404,
    `no route ${method} ${pathname}; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health`,
  );
}

/** Builds the HTTP app around a scheduler. */
function createApp({ scheduler, modelName, maxBodyBytes }) {
  const created = Math.floor(Date.now() / 1000);
  const modelCard = { id: modelName, object: 'model', created, owned_by: 'llama-branch' };

  async function generateEndpoint(kind, req, res) {
    const body = await readJsonBody(req, maxBodyBytes);
    const request = generateRequest(kind, body, modelName);
    // The client going away (before the response is complete) aborts the generation.
    const controller = new AbortController();
    res.on('error', () => {}); // a write racing the client's disconnect: the abort below handles it
    res.on('close', () => {
      if (!res.writableFinished) controller.abort(new Error('client disconnected'));
    });
    request.signal = controller.signal;
    const gen = scheduler.generate(request);
    const shape = ENDPOINTS[kind];
    const head = {
      id: shape.idPrefix + randomUUID(),
      object: shape.object,
      created: Math.floor(Date.now() / 1000),
      model: modelName,
    };
    if (body.stream) {
      const includeUsage = Boolean(body.stream_options && body.stream_options.include_usage);
      await streamGeneration(res, gen, { shape, head, n: request.n || 1, includeUsage });
      return;
    }
    const result = await gen;
    if (controller.signal.aborted) return;
    sendJson(res, 200, { ...head, choices: result.choices.map(shape.choice), usage: usageOf(result.usage) });
  }

  const routes = {
    'GET /health': (req, res) => sendJson(res, 200, { status: 'ok', model: modelName, ...scheduler.stats() }),
    'GET /v1/models': (req, res) => sendJson(res, 200, { object: 'list', data: [modelCard] }),
    'POST /v1/completions': (req, res) => generateEndpoint('completions', req, res),
    'POST /v1/chat/completions': (req, res) => generateEndpoint('chat', req, res),
  };

  return async function handle(req, res) {
    try {
      const { pathname } = new URL(req.url, 'http://localhost');
      const route = routes[`${req.method} ${pathname.replace(/\/+$/, '') || '/'}`];
      if (route) await route(req, res);
      else unrouted(req.method, pathname, routes, res, modelCard);
    } catch (e) {
      sendError(res, e);
    }
  };
}

/**
 * Creates the server on `options.ctx`, or on a context it loads from `options.modelPath`.
 * See ServerOptions in index.d.ts.
 */
async function createServer(options) {
  if (options === null || typeof options !== 'object')
    throw makeError('ERR_INVALID_ARG', 'createServer(options): expected { ctx } or { modelPath }');
  if (!options.ctx === !options.modelPath)
    throw makeError('ERR_INVALID_ARG', 'createServer(options): give exactly one of ctx or modelPath');
  const parallel = options.parallel === undefined ? defaults.server.parallel : options.parallel;
  if (!isInt(parallel) || parallel < 1)
    throw makeError('ERR_INVALID_ARG', `options.parallel must be a positive integer, got ${parallel}`);
  const maxBodyBytes = options.maxBodyBytes === undefined ? defaults.server.maxBodyBytes : options.maxBodyBytes;
  let ctx = options.ctx;
  const ownsContext = !ctx;
  if (ownsContext) {
    const { createContext } = require('./index'); // the package entry requires this file
    ctx = await createContext({
      modelPath: options.modelPath,
      nCtx: options.nCtx === undefined ? defaults.server.nCtx : options.nCtx,
      nSeqMax: options.nSeqMax === undefined ? defaults.serverSeqMax(parallel) : options.nSeqMax,
      nThreads: options.nThreads,
    });
  }
  const modelName =
    options.modelName ||
    (options.modelPath ? path.basename(String(options.modelPath)).replace(/\.gguf$/i, '') : 'llama-branch');
  let scheduler;
  try {
    scheduler = new Scheduler(ctx, { maxRunning: parallel, ...options.scheduler });
  } catch (e) {
    if (ownsContext) ctx.dispose();
    throw e;
  }
  const app = createApp({ scheduler, modelName, maxBodyBytes });
  const server = http.createServer((req, res) => {
    app(req, res);
  });

  return {
    ctx,
    scheduler,
    modelName,
    http: server,
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
      await closed;
      if (ownsContext) ctx.dispose();
    },
  };
}

module.exports = { createServer };
