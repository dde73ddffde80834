'use strict';

/**
 * The gRPC worker's Generate (./grpc.js): a vLLM-engine `GenerateRequest` as a Scheduler request,
 * its events as `GenerateStreamChunk`s (each the new tokens of one choice) and one
 * `GenerateComplete` per choice; whole, one `GenerateComplete` per choice with all its tokens.
 * A request this worker cannot serve as asked (logprobs, regex or structural-tag constraints,
 * ignore_eos, ...) is INVALID_ARGUMENT before anything runs, with what to change.
 */

const grpc = require('@grpc/grpc-js');
const { makeError } = require('../errors');

/** A coded error of lib/ as a gRPC status. */
function statusOf(e) {
  const code =
    {
      ERR_INVALID_ARG: grpc.status.INVALID_ARGUMENT,
      ERR_TOKEN_OUT_OF_RANGE: grpc.status.INVALID_ARGUMENT,
      ERR_PROMPT_TOO_LONG: grpc.status.INVALID_ARGUMENT,
      ERR_GRAMMAR: grpc.status.INVALID_ARGUMENT,
      ERR_QUEUE_FULL: grpc.status.RESOURCE_EXHAUSTED,
      ERR_TOKENIZER_UNSUPPORTED: grpc.status.FAILED_PRECONDITION,
      ERR_SCHEDULER_CLOSED: grpc.status.UNAVAILABLE,
      ERR_CONTEXT_DISPOSED: grpc.status.UNAVAILABLE,
    }[e && e.code] ?? grpc.status.INTERNAL;
  return { code, details: `${e && e.code ? `${e.code}: ` : ''}${(e && e.message) || e}` };
}

const invalid = (message) => makeError('ERR_INVALID_ARG', message);

/** The sampler fields of SamplingParams that are set (proto3 zeros mean unset). */
function samplerOf(p) {
  const params = {};
  if (p.temperature !== undefined && p.temperature !== null) params.temperature = p.temperature;
  if (p.top_p > 0) params.topP = p.top_p;
  if (p.top_k > 0) params.topK = p.top_k;
  if (p.min_p > 0) params.minP = p.min_p;
  if (p.seed !== undefined && p.seed !== null) params.seed = p.seed >>> 0;
  const penalties = {};
  if (p.repetition_penalty > 0 && p.repetition_penalty !== 1) penalties.repeat = p.repetition_penalty;
  if (p.frequency_penalty) penalties.frequency = p.frequency_penalty;
  if (p.presence_penalty) penalties.presence = p.presence_penalty;
  if (Object.keys(penalties).length > 0) params.penalties = penalties;
  return params;
}

/** What this worker refuses in SamplingParams, said as what to change; null when all is served. */
function refused(p) {
  if (p.logprobs !== undefined && p.logprobs !== null) return 'logprobs are not served over gRPC: ask the HTTP server';
  if (p.ignore_eos) return 'ignore_eos is not supported: raise max_tokens instead';
  if (p.min_tokens > 0) return 'min_tokens is not supported';
  if (p.regex || p.structural_tag)
    return 'regex and structural_tag constraints are not supported: give json_schema or a GBNF grammar';
  if (p.stop_token_ids.length > 0 && p.n > 1) return 'stop_token_ids with n > 1 is not supported: send n requests';
  return null;
}

/** The Scheduler request of a GenerateRequest (throws ERR_INVALID_ARG with what to change). */
function requestOf(req) {
  const p = req.sampling_params || { stop: [], stop_token_ids: [] };
  const why = refused(p);
  if (why) throw invalid(why);
  const request = { params: samplerOf(p) };
  if (req.input === 'tokenized') {
    if (req.tokenized.input_ids.length === 0) throw invalid('tokenized.input_ids is empty');
    request.tokens = req.tokenized.input_ids;
  } else if (req.input === 'text' && req.text.length > 0) request.prompt = req.text;
  else throw invalid('a GenerateRequest needs tokenized.input_ids or text');
  if (p.max_tokens !== undefined && p.max_tokens !== null) request.maxTokens = p.max_tokens;
  if (p.n > 1) request.n = p.n;
  if (p.stop.length > 0) request.stop = p.stop;
  if (p.json_schema) request.jsonSchema = p.json_schema;
  else if (p.json_object) request.jsonSchema = { type: 'object' };
  else if (p.grammar) request.grammar = p.grammar;
  return request;
}

/** Generate: runs the request, streaming or whole, until done, aborted or the call is cancelled. */
async function generateOf(worker, call) {
  const req = call.request;
  let request;
  try {
    request = requestOf(req);
  } catch (e) {
    return call.emit('error', statusOf(e));
  }
  const id = req.request_id || `grpc-${worker.requests.size}-${Date.now()}`;
  const controller = new AbortController();
  worker.requests.set(id, controller);
  call.on('cancelled', () => controller.abort());
  request.signal = controller.signal;
  const stopIds = new Set((req.sampling_params && req.sampling_params.stop_token_ids) || []);
  try {
    await runGeneration(worker.scheduler.generate(request), call, {
      stream: req.stream,
      stopIds,
      controller,
      prompt: request.tokens ? request.tokens.length : 0,
    });
  } catch (e) {
    if (!call.cancelled) call.emit('error', statusOf(e));
  } finally {
    worker.requests.delete(id);
  }
}

/** Streams `gen`'s events (or waits for its result) and writes the completes. */
async function runGeneration(gen, call, { stream, stopIds, controller, prompt }) {
  const matched = new Map(); // choice -> stop token id that ended it
  const tokens = new Map(); // choice -> tokens sent (whole: all of them)
  for await (const event of gen) {
    if (event.token === null || matched.has(event.choice)) continue;
    if (!tokens.has(event.choice)) tokens.set(event.choice, []);
    tokens.get(event.choice).push(event.token);
    if (stream)
      call.write({
        chunk: {
          token_ids: [event.token],
          prompt_tokens: prompt,
          completion_tokens: 1,
          cached_tokens: 0,
          index: event.choice,
        },
      });
    if (stopIds.has(event.token)) {
      matched.set(event.choice, event.token);
      controller.abort(); // n is 1 with stop_token_ids (refused otherwise)
    }
  }
  const result = await gen;
  const usage = result.usage;
  result.choices.forEach((choice, index) => {
    const stopToken = matched.get(index);
    const finish =
      stopToken !== undefined ? 'stop' : choice.finishReason === 'tool_calls' ? 'stop' : choice.finishReason;
    const sent = tokens.get(index) || [];
    call.write({
      complete: {
        output_ids: stream ? [] : sent,
        finish_reason: finish,
        prompt_tokens: usage.promptTokens,
        completion_tokens: sent.length,
        cached_tokens: usage.cachedPromptTokens,
        index,
        ...(stopToken !== undefined ? { matched_token_id: stopToken } : {}),
        spec_accepted_tokens: usage.acceptedDraftTokens || 0,
        spec_draft_tokens: usage.draftTokens || 0,
      },
    });
  });
  call.end();
}

module.exports = { generateOf, statusOf, requestOf };
