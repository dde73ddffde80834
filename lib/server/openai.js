'use strict';

/**
 * OpenAI's request and response shapes for /v1/completions and /v1/chat/completions: request
 * fields → a Scheduler request (every field checked, a 400 naming it otherwise), and the
 * Scheduler's choices and events → OpenAI's choices, chunks, tool calls and logprobs.
 */

const { HttpError, badRequest } = require('./http');
const { dataUrlBytes } = require('../chat-images');
const defaults = require('../defaults');

const isInt = (v) => Number.isInteger(v);
const given = (v) => v !== undefined && v !== null;

function optionalNumber(body, name, check, what) {
  const v = body[name];
  if (!given(v)) return undefined;
  if (typeof v !== 'number' || !check(v)) throw badRequest(`${name} must be ${what}`, name);
  return v;
}

/** The fields both endpoints share: sampling, n, max_tokens, stop, seed, response_format. */
function commonRequest(body, limits, maxTokensDefault) {
  const request = { params: {} };
  const temperature = optionalNumber(body, 'temperature', (v) => v >= 0 && v <= 2, 'a number in [0, 2]');
  if (temperature !== undefined) request.params.temperature = temperature;
  const topP = optionalNumber(body, 'top_p', (v) => v > 0 && v <= 1, 'a number in (0, 1]');
  if (topP !== undefined) request.params.topP = topP;
  const presence = optionalNumber(body, 'presence_penalty', (v) => v >= -2 && v <= 2, 'a number in [-2, 2]');
  const frequency = optionalNumber(body, 'frequency_penalty', (v) => v >= -2 && v <= 2, 'a number in [-2, 2]');
  if (presence || frequency) request.params.penalties = { presence: presence || 0, frequency: frequency || 0 };
  request.n = optionalNumber(
    body,
    'n',
    (v) => isInt(v) && v >= 1 && v <= limits.maxN,
    `an integer in [1, ${limits.maxN}]`,
  );
  const maxTokens = given(body.max_completion_tokens) ? 'max_completion_tokens' : 'max_tokens';
  request.maxTokens =
    optionalNumber(
      body,
      maxTokens,
      (v) => isInt(v) && v >= 1 && v <= limits.maxTokens,
      `an integer in [1, ${limits.maxTokens}] (this server's cap)`,
    ) || maxTokensDefault;
  request.seed = optionalNumber(body, 'seed', (v) => isInt(v), 'an integer');
  if (request.seed !== undefined) request.seed = ((request.seed % 2 ** 32) + 2 ** 32) % 2 ** 32;
  const { stop } = body;
  if (given(stop)) {
    const stops = typeof stop === 'string' ? [stop] : stop;
    if (!Array.isArray(stops) || stops.length > 16 || !stops.every((s) => typeof s === 'string'))
      throw badRequest('stop must be a string or an array of at most 16 strings', 'stop');
    request.stop = stops;
  }
  const schema = responseSchema(body.response_format);
  if (schema) request.jsonSchema = schema;
  const cacheKey = cacheKeyOf(body);
  if (cacheKey !== undefined) request.cacheKey = cacheKey;
  return request;
}

/**
 * The client's cache hint: OpenAI's `prompt_cache_key`, else a `session_id` (as agent clients
 * send it); the prefixes its requests cache are kept warm longer (docs/serving.md).
 */
function cacheKeyOf(body) {
  for (const name of ['prompt_cache_key', 'session_id']) {
    const v = body[name];
    if (!given(v)) continue;
    if (typeof v !== 'string' || v.length > 1024)
      throw badRequest(`${name} must be a string of at most 1024 characters`, name);
    return `${name}:${v}`;
  }
  return undefined;
}

/** The JSON schema `response_format` asks for (undefined for text or none). */
function responseSchema(format) {
  if (!given(format)) return undefined;
  if (typeof format !== 'object' || typeof format.type !== 'string')
    throw badRequest('response_format must be an object with a type', 'response_format');
  if (format.type === 'json_object') return { type: 'object' };
  if (format.type === 'text') return undefined;
  if (format.type !== 'json_schema')
    throw badRequest(
      `response_format.type must be text, json_object or json_schema, got ${format.type}`,
      'response_format',
    );
  const schema = format.json_schema && format.json_schema.schema;
  if (!schema || typeof schema !== 'object')
    throw badRequest('response_format.json_schema.schema must be a JSON schema object', 'response_format');
  return schema;
}

/** The prompt of /v1/completions; null (which OpenAI's schema allows) is the model's BOS alone. */
function completionsPrompt(body, bosToken) {
  let { prompt } = body;
  if (prompt === null) return { tokens: [bosToken] };
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string') prompt = prompt[0];
  if (typeof prompt === 'string' && prompt !== '') return { prompt };
  if (Array.isArray(prompt) && prompt.length > 0 && prompt.every(isInt)) return { tokens: prompt };
  throw badRequest('prompt must be a non-empty string (or an array of token ids); one prompt per request', 'prompt');
}

/**
 * The image of an `image_url` part as `{ type: 'image', image: bytes }`: only a base64 data URL is
 * taken (the server never fetches a URL), and only by a server with a projector (`--mmproj`).
 * @param {any} part @param {string} where @param {boolean} vision whether the server has a projector
 */
function imagePart(part, where, vision) {
  const url = typeof part.image_url === 'string' ? part.image_url : part.image_url?.url;
  if (typeof url !== 'string')
    throw badRequest(`${where}.image_url must be {url} with a data: URL of the image`, 'messages');
  // An http(s) URL is refused as never fetched, with or without a projector.
  if (!vision && !/^https?:/i.test(url))
    throw badRequest(
      `${where}: this server has no image projector, so it takes no images; start it with --mmproj FILE (the model's mmproj GGUF) or send text parts`,
      'messages',
    );
  return { type: 'image', image: dataUrlBytes(url, where, '.image_url.url', 'messages') };
}

/**
 * A message's content: a string (text parts joined), or with images (`vision`: the server has a
 * projector) the Scheduler's parts `{ type: 'text', text }` and `{ type: 'image', image }`.
 */
function contentOf(m, i, vision) {
  let content = m.content;
  if (Array.isArray(content)) {
    const parts = content.map((p, k) => {
      if (p && p.type === 'image_url') return imagePart(p, `messages[${i}].content[${k}]`, vision);
      if (p && p.type === 'text' && typeof p.text === 'string') return { type: 'text', text: p.text };
      throw badRequest(`messages[${i}].content[${k}]: only text and image_url parts are supported`, 'messages');
    });
    if (parts.some((p) => p.type === 'image')) {
      if (m.role !== 'user') throw badRequest(`messages[${i}]: images are taken in user messages only`, 'messages');
      return parts;
    }
    content = parts.map((p) => /** @type {any} */ (p).text).join('');
  }
  if (!given(content)) return '';
  if (typeof content !== 'string')
    throw badRequest(`messages[${i}].content must be a string or an array of text and image_url parts`, 'messages');
  return content;
}

/** An assistant message's tool_calls, checked (ids, names, arguments that are JSON text). */
function historyToolCalls(calls, i) {
  const where = `messages[${i}].tool_calls`;
  if (!Array.isArray(calls)) throw badRequest(`${where} must be an array`, 'messages');
  return calls.map((c, k) => {
    const fn = c && c.function;
    if (!c || typeof c.id !== 'string' || c.type !== 'function' || !fn || typeof fn.name !== 'string')
      throw badRequest(`${where}[${k}] must be {id, type: 'function', function: {name, arguments}}`, 'messages');
    const args = fn.arguments === undefined ? '{}' : fn.arguments;
    try {
      if (typeof args !== 'string') throw new Error('not a string');
      JSON.parse(args);
    } catch {
      throw badRequest(`${where}[${k}].function.arguments must be JSON text`, 'messages');
    }
    return { id: c.id, type: 'function', function: { name: fn.name, arguments: args } };
  });
}

const ROLES = ['system', 'developer', 'user', 'assistant', 'tool'];

/** OpenAI messages → the Scheduler's; a tool message must answer a call made earlier. */
function chatMessages(body, vision = false) {
  const { messages } = body;
  if (!Array.isArray(messages) || messages.length === 0)
    throw badRequest('messages must be a non-empty array', 'messages');
  const callIds = new Set();
  return messages.map((m, i) => {
    if (m === null || typeof m !== 'object' || !ROLES.includes(m.role))
      throw badRequest(`messages[${i}] must be an object with a role (${ROLES.join(', ')})`, 'messages');
    const out = { role: m.role, content: contentOf(m, i, vision) };
    if (typeof m.name === 'string') out.name = m.name;
    if (m.role === 'assistant' && given(m.tool_calls)) {
      out.tool_calls = historyToolCalls(m.tool_calls, i);
      for (const c of out.tool_calls) callIds.add(c.id);
    }
    if (m.role === 'assistant' && typeof m.reasoning_content === 'string') out.reasoning_content = m.reasoning_content;
    if (m.role === 'tool') {
      if (typeof m.tool_call_id !== 'string' || !callIds.has(m.tool_call_id))
        throw badRequest(
          `messages[${i}] is a tool result whose tool_call_id ${JSON.stringify(m.tool_call_id)} answers no tool call of an earlier assistant message`,
          'messages',
        );
      out.tool_call_id = m.tool_call_id;
    }
    return out;
  });
}

/** tools, tool_choice, parallel_tool_calls and reasoning → the Scheduler's chat fields. */
function chatFields(body, reasoningFormat) {
  const fields = {};
  if (given(body.tools)) {
    if (!Array.isArray(body.tools)) throw badRequest('tools must be an array of function tools', 'tools');
    if (body.tools.length > 0) fields.tools = body.tools;
  }
  if (given(body.tool_choice)) {
    const choice = body.tool_choice;
    const named = typeof choice === 'object' && choice.function && choice.function.name;
    if (named && !(fields.tools || []).some((t) => t && t.function && t.function.name === named))
      throw badRequest(`tool_choice names function ${JSON.stringify(named)}, which is not in tools`, 'tool_choice');
    fields.toolChoice = choice;
  }
  if (given(body.parallel_tool_calls)) {
    if (typeof body.parallel_tool_calls !== 'boolean')
      throw badRequest('parallel_tool_calls must be a boolean', 'parallel_tool_calls');
    fields.parallelToolCalls = body.parallel_tool_calls;
  }
  // Absent, parallel_tool_calls is false (llama.cpp's server default, not OpenAI's): a small
  // model allowed a list of calls tends to repeat the first one until max_tokens.
  const format = given(body.reasoning_format) ? body.reasoning_format : reasoningFormat;
  if (format !== 'none' || given(body.reasoning_format)) fields.reasoningFormat = format;
  const kwargs = body.chat_template_kwargs;
  if (kwargs && typeof kwargs === 'object' && given(kwargs.enable_thinking)) {
    if (typeof kwargs.enable_thinking !== 'boolean')
      throw badRequest('chat_template_kwargs.enable_thinking must be a boolean', 'chat_template_kwargs');
    fields.enableThinking = kwargs.enable_thinking;
  }
  return fields;
}

/** `logprobs`/`top_logprobs` of a chat request, `logprobs: k` of a completion → the Scheduler's. */
function logprobsField(kind, body) {
  if (kind === 'chat') {
    if (given(body.logprobs) && typeof body.logprobs !== 'boolean')
      throw badRequest('logprobs must be a boolean', 'logprobs');
    const top = optionalNumber(body, 'top_logprobs', (v) => isInt(v) && v >= 0 && v <= 20, 'an integer in [0, 20]');
    if (top !== undefined && !body.logprobs) throw badRequest('top_logprobs needs logprobs: true', 'top_logprobs');
    return body.logprobs ? top || 0 : undefined;
  }
  const k = optionalNumber(body, 'logprobs', (v) => isInt(v) && v >= 0 && v <= 5, 'an integer in [0, 5]');
  return k;
}

/** The 404 of a request naming a model other than the one this server serves (none named: fine). */
function checkModel(body, modelName) {
  if (given(body.model) && body.model !== modelName) {
    throw new HttpError(
      404,
      `The model \`${body.model}\` does not exist; this server serves \`${modelName}\` (GET /v1/models)`,
      { param: 'model', code: 'model_not_found' },
    );
  }
}

/**
 * The Scheduler request of an OpenAI request `body` to endpoint `kind` ('completions' | 'chat').
 * @param {'completions' | 'chat'} kind
 * @param {any} body
 * @param {{ modelName: string, bosToken: number, reasoningFormat: string, vision?: boolean, limits: { maxTokens: number, maxN: number } }} env
 */
function generateRequest(kind, body, env) {
  checkModel(body, env.modelName);
  const request = commonRequest(
    body,
    env.limits,
    kind === 'completions' ? defaults.server.completionsMaxTokens : undefined,
  );
  if (kind === 'chat')
    Object.assign(request, { messages: chatMessages(body, env.vision) }, chatFields(body, env.reasoningFormat));
  else Object.assign(request, completionsPrompt(body, env.bosToken));
  const logprobs = logprobsField(kind, body);
  if (logprobs !== undefined) request.logprobs = logprobs;
  if (given(body.stream) && typeof body.stream !== 'boolean') throw badRequest('stream must be a boolean', 'stream');
  return request;
}

// -------------------------------------------------------------------------------------------------
// Responses

/** OpenAI's finish_reason of a Scheduler finish reason. */
const finishReason = (reason) => (reason === 'abort' ? 'stop' : reason);

function usageOf(usage) {
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.completionTokens,
    total_tokens: usage.promptTokens + usage.completionTokens,
    prompt_tokens_details: { cached_tokens: usage.cachedPromptTokens },
    ...(usage.draftTokens === undefined
      ? {}
      : {
          // OpenAI's names for predicted-output tokens: draft tokens kept and thrown away.
          completion_tokens_details: {
            accepted_prediction_tokens: usage.acceptedDraftTokens,
            rejected_prediction_tokens: usage.draftTokens - usage.acceptedDraftTokens,
          },
        }),
  };
}

const bytesOf = (text) => Array.from(Buffer.from(text, 'utf8'));

/** Chat logprob entries of generated tokens (`tokenText` names the alternatives). */
function chatLogprobs(entries, tokenText) {
  return {
    content: entries.map((e) => ({
      token: e.text,
      logprob: e.logprob,
      bytes: bytesOf(e.text),
      top_logprobs: e.top.map((t) => {
        const text = tokenText(t.token);
        return { token: text, logprob: t.logprob, bytes: bytesOf(text) };
      }),
    })),
    refusal: null,
  };
}

/** Legacy completions logprobs of generated tokens; `offset` is where the first token's text starts. */
function completionLogprobs(entries, tokenText, offset = 0) {
  const out = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const e of entries) {
    out.tokens.push(e.text);
    out.token_logprobs.push(e.logprob);
    out.top_logprobs.push(Object.fromEntries(e.top.map((t) => [tokenText(t.token), t.logprob])));
    out.text_offset.push(offset);
    offset += e.text.length;
  }
  return out;
}

const toolCallOf = (c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } });

/** The assistant message of a finished chat choice. */
function chatMessage(c) {
  const calls = c.toolCalls || [];
  const content = c.content !== undefined ? c.content : c.text;
  const message = { role: 'assistant', content: calls.length > 0 && content === '' ? null : content, refusal: null };
  if (calls.length > 0) message.tool_calls = calls.map(toolCallOf);
  if (c.reasoningContent) message.reasoning_content = c.reasoningContent;
  return message;
}

/** A chat chunk's delta of an event: parsed deltas when the request is parsed, else the text. */
function chatDelta(e) {
  if (e.delta === undefined) return e.text === '' ? {} : { content: e.text };
  const delta = {};
  if (!e.delta) return delta;
  if (e.delta.reasoningContent) delta.reasoning_content = e.delta.reasoningContent;
  if (e.delta.content) delta.content = e.delta.content;
  if (e.delta.toolCalls)
    delta.tool_calls = e.delta.toolCalls.map((c) =>
      // A call's first piece names it; the later ones carry more of its arguments.
      c.id === undefined
        ? { index: c.index, function: { arguments: c.arguments } }
        : { index: c.index, ...toolCallOf(c) },
    );
  return delta;
}

/**
 * The OpenAI shapes of one endpoint: a whole choice, a streamed piece of one (null: nothing to
 * send), and the chunk that opens a choice.
 */
const ENDPOINTS = {
  completions: {
    idPrefix: 'cmpl-',
    object: 'text_completion',
    chunkObject: 'text_completion',
    choice: (c, index, tokenText) => ({
      index,
      text: c.text,
      finish_reason: finishReason(c.finishReason),
      logprobs: c.logprobs ? completionLogprobs(c.logprobs, tokenText) : null,
    }),
    chunk: (e, tokenText, offsets) => {
      if (e.text === '' && !e.finishReason) return null;
      const logprobs =
        e.logprob === undefined
          ? null
          : completionLogprobs([{ text: e.text, logprob: e.logprob, top: e.top }], tokenText, offsets[e.choice]);
      offsets[e.choice] += e.text.length;
      return {
        index: e.choice,
        text: e.text,
        finish_reason: e.finishReason ? finishReason(e.finishReason) : null,
        logprobs,
      };
    },
    opening: null,
  },
  chat: {
    idPrefix: 'chatcmpl-',
    object: 'chat.completion',
    chunkObject: 'chat.completion.chunk',
    choice: (c, index, tokenText) => ({
      index,
      message: chatMessage(c),
      finish_reason: finishReason(c.finishReason),
      logprobs: c.logprobs ? chatLogprobs(c.logprobs, tokenText) : null,
    }),
    chunk: (e, tokenText) => {
      const delta = chatDelta(e);
      const logprobs =
        e.logprob === undefined ? null : chatLogprobs([{ text: e.text, logprob: e.logprob, top: e.top }], tokenText);
      if (Object.keys(delta).length === 0 && !e.finishReason && !logprobs) return null;
      return { index: e.choice, delta, finish_reason: e.finishReason ? finishReason(e.finishReason) : null, logprobs };
    },
    opening: (index) => ({ index, delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null }),
  },
};

module.exports = { generateRequest, checkModel, usageOf, ENDPOINTS };
