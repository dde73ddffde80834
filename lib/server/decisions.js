'use strict';

/**
 * POST /v1/decisions: OpenAI's Decisions API (the `openai` clients' `decisions.create`; their
 * `resources/decisions` types define the wire format) over `scheduler.decide()`, the engine
 * /v1/systemone uses (lib/decisions/). The body's `input` and `questions` are checked there; the
 * answer is `{ model, answers, usage }` with the answers in question order and the usage's
 * `input_tokens_details` (`cached_tokens`: input served from the prefix cache, `cache_write_tokens`:
 * the state this request left in it). Errors are OpenAI's envelope, as on every other route.
 */

const { checkDecisionBody, badRequest, sendJson, readJsonBody, abortOnDisconnect } = require('./http');

const FIELDS = ['model', 'input', 'questions', 'prompt_cache_key', 'prompt_cache_options', 'safety_identifier'];

/** An optional string field of at most `max` characters (null allowed). */
function optionalString(body, field, max) {
  const v = body[field];
  if (v !== undefined && v !== null && (typeof v !== 'string' || v.length > max))
    throw badRequest(`${field} must be a string of at most ${max} characters`, field);
  return typeof v === 'string' ? v : undefined;
}

/** `prompt_cache_options`: accepted as OpenAI defines it (breakpoints are always honoured here). */
function checkCacheOptions(value) {
  if (value === undefined || value === null) return;
  const ok =
    typeof value === 'object' &&
    !Array.isArray(value) &&
    Object.keys(value).every((k) => k === 'mode' || k === 'ttl') &&
    [undefined, null, 'implicit', 'explicit'].includes(value.mode) &&
    [undefined, '30m'].includes(value.ttl);
  if (!ok)
    throw badRequest(
      "prompt_cache_options must be { mode?: 'implicit' | 'explicit', ttl?: '30m' }",
      'prompt_cache_options',
    );
}

/** The route's handler (`app`: what the server set up: scheduler, model name, metrics, CORS). */
function decisionsRoute(app) {
  return async (req, res) => {
    const body = await readJsonBody(req, app.maxBodyBytes);
    checkDecisionBody(body, FIELDS, FIELDS.join(', '), app.modelName);
    if (body.input === undefined) throw badRequest('input is required: a string or an array of input items', 'input');
    if (body.questions === undefined)
      throw badRequest('questions is required: an array of 1-400 questions', 'questions');
    const promptCacheKey = optionalString(body, 'prompt_cache_key', 1024);
    const safetyIdentifier = optionalString(body, 'safety_identifier', 256);
    checkCacheOptions(body.prompt_cache_options);
    const signal = abortOnDisconnect(res);
    const result = await app.scheduler.decide({
      input: body.input,
      questions: body.questions,
      ...(promptCacheKey === undefined ? {} : { promptCacheKey }),
      ...(safetyIdentifier === undefined ? {} : { safetyIdentifier }),
      signal,
    });
    if (signal.aborted) return;
    const { usage } = result;
    app.metrics.decision(result.answers.length, usage.inputTokens);
    sendJson(
      res,
      200,
      {
        model: app.modelName,
        answers: result.answers,
        usage: {
          input_tokens: usage.inputTokens,
          input_tokens_details: { cached_tokens: usage.cachedTokens, cache_write_tokens: usage.cacheWriteTokens },
          output_tokens: 0,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: usage.inputTokens,
        },
      },
      app.corsHeaders,
    );
  };
}

module.exports = { decisionsRoute };
