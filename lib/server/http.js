'use strict';

/**
 * HTTP plumbing of the server: errors in OpenAI's shape, JSON bodies in and out, a request's
 * abort when its client goes away. Nothing here knows an endpoint.
 */

const { invalidArg } = require('../errors');

/**
 * An error with an HTTP status other than a bad argument's 400 (401, 404, 405, 413, ...) and the
 * OpenAI error fields it is answered with. A bad argument is lib/'s one `invalidArg` everywhere.
 */
class HttpError extends Error {
  constructor(status, message, { type = 'invalid_request_error', param = null, code = null, headers = {} } = {}) {
    super(message);
    this.status = status;
    /** Extra response headers (`Allow` of a 405, `WWW-Authenticate` of a 401). */
    this.headers = headers;
    this.type = type;
    this.param = param;
    this.errorCode = code;
  }
}

/** A client's bad argument (400 naming `param`): the same error the library's checks throw. */
const badRequest = (message, param = null) => invalidArg(message, param);

/** Package error codes a client can cause, and how they are answered. */
const CLIENT_ERRORS = {
  ERR_INVALID_ARG: [400, 'invalid_request_error'],
  ERR_GRAMMAR: [400, 'invalid_request_error'],
  ERR_CHAT_TEMPLATE: [400, 'invalid_request_error'],
  ERR_TOKENIZE: [400, 'invalid_request_error'],
  ERR_TOKEN_OUT_OF_RANGE: [400, 'invalid_request_error'],
  ERR_KV_FULL: [400, 'invalid_request_error'],
  ERR_NO_PROJECTOR: [400, 'invalid_request_error'],
  ERR_IMAGE_FORMAT: [400, 'invalid_request_error'],
  ERR_IMAGE_DECODE: [400, 'invalid_request_error'],
  ERR_IMAGE_TOO_LARGE: [400, 'invalid_request_error'],
  ERR_IMAGE_POSITIONS: [400, 'invalid_request_error'],
  ERR_UNSUPPORTED: [400, 'invalid_request_error'],
  ERR_QUEUE_FULL: [429, 'rate_limit_error'],
  ERR_SCHEDULER_CLOSED: [503, 'server_error'],
};

function toHttpError(e) {
  if (e instanceof HttpError) return e;
  const known = e && CLIENT_ERRORS[e.code];
  if (known)
    return new HttpError(known[0], e.message, {
      type: known[1],
      code: e.code.replace(/^ERR_/, '').toLowerCase(),
      param: typeof e.param === 'string' ? e.param : null,
    });
  return new HttpError(500, `internal error: ${e && e.message ? e.message : String(e)}`, { type: 'server_error' });
}

function sendJson(res, status, body, headers = {}) {
  if (res.headersSent) return;
  const data = JSON.stringify(body);
  res.writeHead(status, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
  res.end(data);
}

/** OpenAI's error object of an HttpError. */
function errorBody(err) {
  return { error: { message: err.message, type: err.type, param: err.param, code: err.errorCode } };
}

/** Answers with `e` as an HttpError, `headers` (e.g. CORS) beside its own. */
function sendError(res, e, headers = {}) {
  const err = toHttpError(e);
  sendJson(res, err.status, errorBody(err), { ...headers, ...err.headers });
}

/**
 * An AbortSignal that fires when the client of `res` disconnects before its response is complete
 * (every route that runs work for a client passes it on: its branches are freed within a step).
 * @param {import('http').ServerResponse} res
 * @returns {AbortSignal}
 */
function abortOnDisconnect(res) {
  const controller = new AbortController();
  res.on('error', () => {}); // a write racing the client's disconnect: the abort handles it
  res.on('close', () => {
    if (!res.writableFinished) controller.abort(new Error('client disconnected'));
  });
  return controller.signal;
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
    req.on('error', (e) => !failed && reject(badRequest(`could not read the request body: ${e.message}`)));
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

/**
 * A decision route's first checks of a request `body`: no field outside `fields` (`hint` lists
 * them in the 400), and `model`, when given, is the one this server has (else the 404).
 */
function checkDecisionBody(body, fields, hint, modelName) {
  for (const key of Object.keys(body)) {
    if (!fields.includes(key)) throw badRequest(`unknown field ${JSON.stringify(key)}; a request has ${hint}`, key);
  }
  if (body.model !== undefined && body.model !== modelName) {
    if (typeof body.model !== 'string' || body.model === '')
      throw badRequest('model must be a non-empty string', 'model');
    throw new HttpError(404, `The model \`${body.model}\` does not exist; this server has ${modelName}`, {
      param: 'model',
      code: 'model_not_found',
    });
  }
}

module.exports = {
  HttpError,
  checkDecisionBody,
  badRequest,
  toHttpError,
  errorBody,
  sendJson,
  sendError,
  readJsonBody,
  abortOnDisconnect,
};
