'use strict';

// Checks our server's responses against OpenAI's published API description (the subset vendored
// in openai-schemas.json by vendor.js): a `fetch` for the clients under test that validates every
// response to a served /v1 operation as it passes (JSON bodies, each server-sent event of a
// stream, and every 4xx against ErrorResponse) and keeps what does not validate.

const assert = require('node:assert/strict');
const Ajv = require('ajv');
const SPEC = require('./openai-schemas.json');

const ROOT = 'openai';
const STREAMED_COMPLETION = 'CreateCompletionStreamChunk';
const schemaRef = (name) => ({ $ref: `${ROOT}#/components/schemas/${name}` });

/** The validators, one per schema name (compiled once). */
const validators = (() => {
  // The spec says streamed completions share CreateCompletionResponse, whose `finish_reason` is
  // required and never null, yet every chunk before the last has none yet (OpenAI's own stream
  // sends null there, as llama.cpp's server and we do). Streamed chunks are checked against a copy
  // with that one field widened to null.
  const chunk = structuredClone(SPEC.schemas.CreateCompletionResponse);
  const choice = chunk.properties.choices.items.properties;
  choice.finish_reason = { anyOf: [choice.finish_reason, { type: 'null' }] };
  // And `Embedding.embedding` is only an array of floats there, while `encoding_format: 'base64'`
  // (which the same document's request schema offers) answers a base64 string, in OpenAI's API
  // as in ours: the check accepts either.
  const embedding = structuredClone(SPEC.schemas.Embedding);
  embedding.properties.embedding = { anyOf: [embedding.properties.embedding, { type: 'string' }] };
  const schemas = { ...SPEC.schemas, Embedding: embedding, [STREAMED_COMPLETION]: chunk };
  // Formats (`unixtime`, `uri`) are OpenAI's annotations, and the `discriminator`s and `x-`
  // keywords are codegen hints: not JSON Schema assertions, so they are not checked.
  const ajv = new Ajv({ strict: false, validateFormats: false, allErrors: true });
  ajv.addSchema({ $id: ROOT, components: { schemas } });
  const names = [...Object.values(SPEC.operations).flatMap(Object.values), 'ErrorResponse', STREAMED_COMPLETION];
  return new Map(names.map((n) => [n, ajv.compile(schemaRef(n))]));
})();

/** The schema a response of `method path` (a /v1 path) must validate against, by content type. */
function schemaFor(method, path, status, type) {
  const op = SPEC.operations[`${method} ${path.replace(/^\/v1/, '')}`];
  if (!path.startsWith('/v1/')) return null; // /health, /metrics, the page: not OpenAI's API
  if (status >= 400) return type.startsWith('application/json') ? 'ErrorResponse' : null;
  if (!op || status !== 200) return null; // our own routes (/v1/events, /v1/programs)
  if (type.startsWith('text/event-stream')) {
    return op['text/event-stream'] || (path === '/v1/completions' ? STREAMED_COMPLETION : null);
  }
  return op['application/json'] || null;
}

/** The JSON payloads of a server-sent event stream (without the closing `[DONE]`). */
function sseData(text) {
  const out = [];
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, ''))
      .join('\n');
    if (data !== '' && data !== '[DONE]') out.push(JSON.parse(data));
  }
  return out;
}

/**
 * A conformance checker: `fetch` is a drop-in `fetch` for clients (the `openai` package, the AI
 * SDK, LangChain, plain calls) that validates as it passes; `assertConforms()` waits for the
 * checks of every response so far and fails listing what did not validate; `state.bySchema`
 * counts the bodies validated by schema (so a test can tell that the check ran, and on what).
 */
function conformanceChecker() {
  const pending = [];
  const problems = [];
  const state = { bySchema: {} };
  async function check(method, path, res) {
    const type = res.headers.get('content-type') || '';
    const name = schemaFor(method, path, res.status, type);
    if (!name) return;
    let text;
    try {
      text = await res.text();
    } catch {
      return; // the client cancelled the stream (a test of aborts): nothing whole to check
    }
    const validate = validators.get(name);
    const bodies =
      name !== 'ErrorResponse' && type.startsWith('text/event-stream') ? sseData(text) : [JSON.parse(text)];
    for (const body of bodies) {
      state.bySchema[name] = (state.bySchema[name] || 0) + 1;
      if (!validate(body)) {
        problems.push(
          `${method} ${path} → ${res.status} ${name}: ${JSON.stringify(validate.errors)}\n  ${JSON.stringify(body).slice(0, 400)}`,
        );
      }
    }
  }
  return {
    state,
    async fetch(input, init = {}) {
      const res = await fetch(input, init);
      const request = input instanceof Request ? input : null;
      const method = (init.method || request?.method || 'GET').toUpperCase();
      const { pathname } = new URL(request ? request.url : String(input));
      pending.push(
        check(method, pathname, res.clone()).catch((e) => problems.push(`${method} ${pathname}: ${e.stack}`)),
      );
      return res;
    },
    async assertConforms() {
      await Promise.all(pending.splice(0));
      assert.deepEqual(problems.splice(0), [], 'every response validates against OpenAI’s schemas');
    },
  };
}

module.exports = { conformanceChecker };
