'use strict';

/**
 * POST /v1/systemone: the System One wire format (published as Krite Protocol v1, with JSON
 * schemas for request, response and error). The request's `state` and `questions` go to
 * `scheduler.decide()` (lib/decisions/, which checks them); the answer is
 * `{ model, answers, usage: { input_tokens, output_tokens: 0 }, latency_ms }`, a score's
 * `probabilities` keyed by level index as its `legend` is. Every error of
 * this route, the API key's included, is the protocol's `{ error: { type, message, param } }`,
 * whose `type` is one of its six.
 */

const { checkDecisionBody, badRequest, sendJson, readJsonBody, toHttpError, abortOnDisconnect } = require('./http');

const FIELDS = ['model', 'state', 'questions', 'images'];

/** The protocol's error body and status for anything this route throws. */
function protocolError(e) {
  const http = toHttpError(e);
  let type =
    e && e.reason ? e.reason : http.status >= 500 || http.status === 429 ? 'internal_error' : 'invalid_request';
  if (http.errorCode === 'model_not_found') type = 'unknown_model';
  return {
    status: http.status,
    headers: http.headers,
    body: { error: { type, message: http.message, param: http.param } },
  };
}

/**
 * The protocol's answers from the library's: a score's `probabilities` keyed by level index
 * ("0".."n-1", as its `legend` is), where the library keys them by level name.
 */
function wireAnswers(answers) {
  const out = {};
  for (const [name, a] of Object.entries(answers)) {
    if (a.type !== 'score') out[name] = a;
    else {
      const probabilities = {};
      for (const [index, level] of Object.entries(a.legend)) probabilities[index] = a.probabilities[level];
      out[name] = { ...a, probabilities };
    }
  }
  return out;
}

/**
 * The route's handler. `app`: what the server set up (scheduler, model name, limits, the key
 * check, CORS headers, metrics).
 */
function systemoneRoute(app) {
  const route = async (req, res) => {
    try {
      app.checkKey(req);
      const body = await readJsonBody(req, app.maxBodyBytes);
      checkDecisionBody(body, FIELDS, 'model, state and questions', app.modelName);
      if (body.state === undefined || body.questions === undefined)
        throw badRequest(
          'a request needs state (a string or a JSON object) and questions',
          body.state === undefined ? 'state' : 'questions',
        );
      const signal = abortOnDisconnect(res);
      const result = await app.scheduler.decide({
        state: body.state,
        questions: body.questions,
        ...(body.images !== undefined ? { images: body.images } : {}),
        maxQuestions: app.limits.maxQuestions,
        signal,
      });
      if (signal.aborted) return;
      app.metrics.decision(Object.keys(result.answers).length, result.usage.inputTokens);
      sendJson(
        res,
        200,
        {
          model: app.modelName,
          answers: wireAnswers(result.answers),
          usage: { input_tokens: result.usage.inputTokens, output_tokens: 0 },
          latency_ms: result.latencyMs,
        },
        app.corsHeaders,
      );
    } catch (e) {
      const { status, headers, body } = protocolError(e);
      sendJson(res, status, body, { ...app.corsHeaders, ...headers });
    }
  };
  route.public = true; // it checks the key itself, to answer a missing one in the protocol's shape
  return route;
}

module.exports = { systemoneRoute };
