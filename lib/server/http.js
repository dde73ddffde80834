'use strict';

/**
 * HTTP plumbing of the server: errors in OpenAI's shape, JSON bodies in and out. Nothing here
 * knows an endpoint.
 */

/** An error with the HTTP status and OpenAI error fields it is answered with. */
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

module.exports = { HttpError, badRequest, toHttpError, errorBody, sendJson, sendError, readJsonBody };
