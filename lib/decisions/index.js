'use strict';

/**
 * Typed decisions (docs/decisions.md), a layer above the Scheduler: closed questions about a
 * state answered with probabilities, nothing generated. Three doors share this one engine —
 * `scheduler.decide` (either format), `POST /v1/systemone` and `POST /v1/decisions` (both over
 * `scheduler.decide`) — and `line.decide` inside a program: each request is checked once
 * (./checks.js), planned once (./plan.js) and asked by the one `ask` (./ask.js) on a program's
 * line; the answers are written in the format it came in (./answers.js). The same question about
 * the same state lays out the same tokens through every door, so the prefix cache's forks of one
 * serve the other.
 */

const { invalidArg } = require('../errors');
const { checkRequest, checkLineDecision } = require('./checks');
const { planDecision, planOnLine, mediaStateOf, questionHeads, questionTokens } = require('./plan');
const { ask } = require('./ask');
const { answersOf } = require('./answers');

/**
 * The state line of a program's root `s`: the state's pieces appended as tokens, each piece
 * after a cache breakpoint on a fork of the line before it, so that the prefix up to every
 * breakpoint is a prefix-cache entry of its own.
 */
function stateLineOf(root, head) {
  let line = root.append(head[0]);
  for (const piece of head.slice(1)) line = line.fork(1)[0].append(piece);
  return line;
}

/**
 * `scheduler.decide(request)`: the state rendered and prefilled once on a program's line, every
 * question a fork of it, all read in shared steps (a long list in batches, each a program on the
 * state the first cached). `run(fn, options)` runs a branch program whose function gets its root
 * line and the program's `decision` event sender, and resolves `{ value, usage }`.
 * @param {import('../Context').SessionContext} ctx
 * @param {any} request
 * @param {(fn: (s: any, emit: (fields: object) => void) => Promise<any>, options: object) => Promise<{ value: any, usage: any }>} run
 * @param {boolean} [parseSpecial] client text that spells special tokens parsed as them (default: plain text)
 * @returns {Promise<import('../types').DecideResult | import('../types').OpenAIDecideResult>}
 */
async function decide(ctx, request, run, parseSpecial = false) {
  const started = performance.now();
  const checked = checkRequest(request);
  // An input or questions with images: tokenized with them first (on the worker).
  await questionHeads(ctx, checked, parseSpecial);
  const plan = planDecision(ctx, checked, parseSpecial, await mediaStateOf(ctx, checked, parseSpecial));
  const position = new Map(plan.items.map((it, i) => [it, i]));
  const probabilities = plan.items.map(() => null);
  const shown = [];
  let cachedTokens = 0;
  let stateCached = 0;
  for (const [b, batch] of plan.batches.entries()) {
    const last = b === plan.batches.length - 1;
    const { value, usage } = await run(
      async (s, emit) => {
        const state = stateLineOf(s, plan.head);
        const asked = await ask(state, batch.items, batch.parallel);
        shown.push(...asked.shown);
        if (last) emit({ branch: state.id, questions: shown }); // one event per decision
        return asked.probabilities;
      },
      {
        maxBranches: batch.maxBranches,
        maxCells: batch.cells,
        // prompt_cache_key: the state's cache entries are kept warm longer, as a request's are
        hinted: checked.promptCacheKey !== null,
        ...(checked.signal ? { signal: checked.signal } : {}),
      },
    );
    batch.items.forEach((it, i) => {
      probabilities[position.get(it)] = value[i];
    });
    // input_tokens count the state once: a later batch's start on it is not input again
    const cached = usage ? usage.cachedPromptTokens : 0;
    if (b === 0) stateCached = Math.min(cached, plan.stateTokens);
    cachedTokens += b === 0 ? cached : Math.max(0, cached - plan.stateTokens);
  }
  const inputTokens = plan.stateTokens + plan.items.reduce((s, it) => s + questionTokens(it), 0);
  const questions = plan.items.map((it) => it.question);
  return {
    answers: answersOf(checked.format, questions, probabilities),
    usage: {
      inputTokens,
      stateTokens: plan.stateTokens,
      outputTokens: /** @type {0} */ (0),
      cachedTokens: Math.min(cachedTokens, inputTokens),
      // the state is kept by the prefix cache for the next decision on it
      cacheWriteTokens: plan.batches.length > 0 ? plan.stateTokens - stateCached : 0,
    },
    latencyMs: performance.now() - started,
  };
}

/**
 * `line.decide(questions, options)`: inside a program, the line's text so far is the state; each
 * question goes on a fork of it after a blank line, raw; the line itself does not change.
 * `emit(fields)` sends the line's `decision` event.
 * @param {any} line a ProgramLine
 * @param {import('../Context').SessionContext} ctx
 * @param {any} questions
 * @param {any} options undefined: the defaults
 * @param {(fields: object) => void} emit
 * @param {boolean} [parseSpecial] the questions' text that spells special tokens parsed as them
 * @returns {Promise<Record<string, import('../types').DecisionAnswer>>}
 */
async function decideOnLine(line, ctx, questions, options, emit, parseSpecial = false) {
  const checked = checkLineDecision(questions, options);
  if (line.tokens.length === 0) throw invalidArg('decide(): the line is empty; append the state first');
  const plan = planOnLine(ctx, checked, parseSpecial);
  const state = { fork: (n) => line.fork(n).map((f) => f.append('\n\n')) };
  const { probabilities, shown } = await ask(state, plan.items, checked.parallel);
  emit({ questions: shown });
  return answersOf('systemone', checked.questions, probabilities);
}

module.exports = { decide, decideOnLine };
