'use strict';

/**
 * Tool calls as instruct models really write them. A template's own call syntax is llama.cpp's
 * to parse (./chat.js); many models answer in another: Qwen2.5-Coder, asked for `<tool_call>`
 * tags, writes a fenced ```json block. A reply is read as calls here when, after the template's
 * parser found none, it ENDS in one or more call objects — fenced, between `<tool_call>` tags,
 * or bare JSON starting a line — each naming a declared tool with arguments that fit its
 * parameter schema. Anything else stays text: an example object in prose, a call to an unknown
 * tool, a call followed by more prose. Streaming holds back what may still become a call, so the
 * content streamed is always a prefix of the finished content. Nothing here knows a model family.
 */

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

const TYPE_CHECKS = {
  string: (v) => typeof v === 'string',
  number: (v) => typeof v === 'number' && Number.isFinite(v),
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === 'boolean',
  null: (v) => v === null,
  array: Array.isArray,
  object: isObject,
};

/**
 * Whether `value` fits `schema`, over the part of JSON schema tool parameters use: type, enum,
 * const, properties, required, additionalProperties, items, anyOf / oneOf / allOf. Keywords
 * beyond it (formats, lengths, patterns) are not checked.
 */
function fitsSchema(value, schema) {
  if (schema === true || schema === undefined || schema === null) return true;
  if (schema === false || typeof schema !== 'object') return false;
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => (TYPE_CHECKS[t] || (() => true))(value))) return false;
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => sameJson(e, value))) return false;
  if ('const' in schema && !sameJson(schema.const, value)) return false;
  if (Array.isArray(schema.anyOf) && !schema.anyOf.some((s) => fitsSchema(value, s))) return false;
  if (Array.isArray(schema.oneOf) && schema.oneOf.filter((s) => fitsSchema(value, s)).length !== 1) return false;
  if (Array.isArray(schema.allOf) && !schema.allOf.every((s) => fitsSchema(value, s))) return false;
  if (Array.isArray(value) && schema.items !== undefined) return value.every((v) => fitsSchema(v, schema.items));
  if (isObject(value)) return fitsObject(value, schema);
  return true;
}

function fitsObject(value, schema) {
  const properties = isObject(schema.properties) ? schema.properties : {};
  if (Array.isArray(schema.required) && !schema.required.every((k) => k in value)) return false;
  for (const [key, v] of Object.entries(value)) {
    if (key in properties) {
      if (!fitsSchema(v, properties[key])) return false;
    } else if (schema.additionalProperties !== undefined && !fitsSchema(v, schema.additionalProperties)) {
      return false;
    }
  }
  return true;
}

const sameJson = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** The keys a call object may have: its name and arguments (or parameters), an id, a type. */
const CALL_KEYS = new Set(['name', 'arguments', 'parameters', 'id', 'type']);

/**
 * A parsed JSON value as one call `{ name, arguments }` (arguments as compact JSON text) of a
 * declared tool whose arguments fit its schema, or null. Takes `{name, arguments}`,
 * `{name, parameters}` and OpenAI's `{type: 'function', function: {name, arguments}}`; arguments
 * may be an object or JSON text of one.
 */
function callOf(value, tools) {
  if (!isObject(value)) return null;
  let call = value;
  if (isObject(value.function) && Object.keys(value).every((k) => k === 'function' || k === 'type' || k === 'id'))
    call = value.function;
  if (typeof call.name !== 'string' || !Object.keys(call).every((k) => CALL_KEYS.has(k))) return null;
  const tool = tools.find((t) => t.function.name === call.name);
  if (!tool) return null;
  let args = call.arguments !== undefined ? call.arguments : call.parameters;
  if (typeof args === 'string') {
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  if (args === undefined) args = {};
  const schema = tool.function.parameters || { type: 'object' };
  if (!isObject(args) || !fitsSchema(args, schema)) return null;
  return { name: call.name, arguments: JSON.stringify(args) };
}

/** JSON text as the calls it holds (one object, or an array of them), or null. */
function callsOfJson(text, tools) {
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return null;
  }
  const items = Array.isArray(value) ? value : [value];
  const calls = items.map((v) => callOf(v, tools));
  return calls.length > 0 && calls.every(Boolean) ? calls : null;
}

/**
 * Where the JSON value starting at `from` (a `{` or `[`) ends: the index after its closing
 * bracket, or -1 when the text ends first. Strings and escapes are skipped; brackets are only
 * counted, so a malformed value is caught by JSON.parse afterwards.
 */
function jsonEnd(text, from) {
  let depth = 0;
  for (let i = from; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++;
      if (i >= text.length) return -1;
    } else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

const FENCE = '```';
const TAG_OPEN = '<tool_call>';
const TAG_CLOSE = '</tool_call>';

/**
 * The block starting at `at` (a line's first non-blank character): `{ end, calls }` for a
 * complete one (calls null: it holds no call), 'open' when the text ends inside it (or inside
 * its opening marker), or null when nothing that can be a call starts there.
 */
function blockAt(text, at, tools) {
  const rest = text.slice(at);
  const opens = (marker) => rest.startsWith(marker) || (marker.startsWith(rest) && rest.length > 0);
  if (opens(FENCE)) {
    const lineEnd = text.indexOf('\n', at);
    if (rest.length < FENCE.length || lineEnd < 0) return 'open';
    const close = text.indexOf(`\n${FENCE}`, lineEnd);
    if (close < 0) return 'open';
    return { end: close + 1 + FENCE.length, calls: callsOfJson(text.slice(lineEnd + 1, close).trim(), tools) };
  }
  if (opens(TAG_OPEN)) {
    if (rest.length < TAG_OPEN.length) return 'open';
    const close = text.indexOf(TAG_CLOSE, at);
    if (close < 0) return 'open';
    return { end: close + TAG_CLOSE.length, calls: callsOfJson(text.slice(at + TAG_OPEN.length, close).trim(), tools) };
  }
  if (rest[0] === '{' || rest[0] === '[') {
    const end = jsonEnd(text, at);
    return end < 0 ? 'open' : { end, calls: callsOfJson(text.slice(at, end), tools) };
  }
  return null;
}

/**
 * The run of call blocks from `at` to the end of the text (blanks between them): its calls,
 * 'open' when the text may still grow into such a run, or null.
 */
function callRun(text, at, tools, partial) {
  const calls = [];
  let i = at;
  for (;;) {
    while (i < text.length && /\s/.test(text[i])) i++;
    if (i >= text.length) return calls.length > 0 ? (partial ? 'open' : calls) : null;
    const block = blockAt(text, i, tools);
    if (block === 'open') return partial ? 'open' : null;
    if (block === null || block.calls === null) return null;
    calls.push(...block.calls);
    i = block.end;
  }
}

/** Where lines start in `text`, at their first non-blank character. */
function* lineStarts(text) {
  for (let i = 0; i < text.length;) {
    let at = i;
    while (at < text.length && (text[at] === ' ' || text[at] === '\t')) at++;
    yield at;
    const newline = text.indexOf('\n', at);
    if (newline < 0) return;
    i = newline + 1;
  }
}

/**
 * A reply's content read for calls. Finished (`partial` false): `{ content, calls }` — the
 * calls the content ends in and the text before them (its trailing blanks cut), or the content
 * as it is with no calls. Partial: `{ content, calls: [] }` with `content` the part that can no
 * longer become a call (trailing blanks held back too, since a call may follow them).
 * @param {string} content
 * @param {any[]} tools the request's declared tools
 * @param {boolean} partial
 * @returns {{ content: string, calls: Array<{ name: string, arguments: string }> }}
 */
function readToolCalls(content, tools, partial) {
  for (const at of lineStarts(content)) {
    const run = callRun(content, at, tools, partial);
    if (run === 'open') return { content: content.slice(0, at).trimEnd(), calls: [] };
    if (run) return { content: content.slice(0, at).trimEnd(), calls: run };
  }
  return { content: partial ? content.trimEnd() : content, calls: [] };
}

/**
 * The JSON schema of a forced reply (tool choice `required`, or a named function): one call
 * object of a declared tool — an array of them when parallel calls are allowed — and nothing
 * else, so its grammar ends the turn at the end-of-turn token after it.
 * @param {any[]} tools
 * @param {boolean} parallel
 */
function forcedCallSchema(tools, parallel) {
  const calls = tools.map((t) => ({
    type: 'object',
    properties: { name: { const: t.function.name }, arguments: t.function.parameters || { type: 'object' } },
    required: ['name', 'arguments'],
    additionalProperties: false,
  }));
  const one = calls.length === 1 ? calls[0] : { anyOf: calls };
  return parallel ? { type: 'array', items: one, minItems: 1 } : one;
}

/** A forced reply's text as its calls (null: it is not, e.g. cut off by maxTokens). */
function readForcedCalls(text, tools) {
  return callsOfJson(text.trim(), tools);
}

module.exports = { readToolCalls, readForcedCalls, forcedCallSchema, fitsSchema, callOf };
