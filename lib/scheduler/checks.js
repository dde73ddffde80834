'use strict';

/**
 * The checks of what `generate()`, `run()` and a program's `gen()` are given: each option
 * validated once, with ERR_INVALID_ARG naming the option and what it accepts.
 */

const { invalidArg: invalid } = require('../errors');
const { isMediaInput, checkMediaPrompt } = require('./media');
const { signalOf } = require('../cancel');

const SEED_SPACE = 2 ** 32;

/** `value` as a positive integer (`fallback` when undefined), else ERR_INVALID_ARG naming it. */
function positiveInt(value, name, fallback) {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1) throw invalid(`${name} must be a positive integer, got ${value}`);
  return value;
}

/** Whether `value` is an array of token ids of a vocabulary of `vocab` tokens (empty allowed). */
function isTokenIds(value, vocab) {
  return Array.isArray(value) && value.every((t) => Number.isInteger(t) && t >= 0 && t < vocab);
}

/** The one input of a request (prompt, tokens or messages), checked. */
function checkInput(request, vocab) {
  if (request === null || typeof request !== 'object')
    throw invalid('generate(request): request must be an object with prompt, tokens or messages');
  const inputs = ['prompt', 'tokens', 'messages'].filter((k) => request[k] !== undefined);
  if (inputs.length !== 1)
    throw invalid(
      `generate(request): give exactly one of prompt, tokens or messages (got ${inputs.length ? inputs.join(', ') : 'none'})`,
    );
  if (isMediaInput(request.prompt)) checkMediaPrompt(request.prompt);
  else if (request.prompt !== undefined && (typeof request.prompt !== 'string' || request.prompt === ''))
    throw invalid('request.prompt must be a non-empty string, a MediaPrompt or an array of prompt parts');
  const { tokens, messages } = request;
  if (tokens !== undefined && (!isTokenIds(tokens, vocab) || tokens.length === 0)) {
    throw invalid(`request.tokens must be a non-empty array of token ids in [0, ${vocab})`);
  }
  if (messages !== undefined && (!Array.isArray(messages) || messages.length === 0))
    throw invalid('request.messages must be a non-empty array of {role, content}');
  if (request.cacheKey !== undefined && (typeof request.cacheKey !== 'string' || request.cacheKey.length > 1024))
    throw invalid('request.cacheKey must be a string of at most 1024 characters');
}

/** The stop strings of a request (a string or an array of them; empty ones dropped). */
function checkStops(stop) {
  let stops = stop === undefined || stop === null ? [] : stop;
  if (typeof stops === 'string') stops = [stops];
  if (!Array.isArray(stops) || !stops.every((s) => typeof s === 'string'))
    throw invalid('request.stop must be a string or an array of strings');
  return stops.filter((s) => s !== '');
}

/** The `logprobs` option: undefined (none), or how many top alternatives (0..20) each token reports. */
function checkLogprobs(value, name) {
  if (value === undefined || value === false || value === null) return undefined;
  if (value === true) return 0;
  if (!Number.isInteger(value) || value < 0 || value > 20)
    throw invalid(`${name} must be true or an integer in 0..20 (top alternatives per token), got ${value}`);
  return value;
}

/**
 * Sampling params without seed and grammar, the seed (undefined: none given, or -1; the caller
 * picks one), and the grammar (GBNF or null).
 */
function checkSampling(request) {
  if (request.params !== undefined && (request.params === null || typeof request.params !== 'object'))
    throw invalid('request.params must be a SamplingParams object');
  const { seed: paramsSeed, grammar: paramsGrammar, ...params } = request.params || {};
  const seed = request.seed !== undefined ? request.seed : paramsSeed;
  if (seed !== undefined && seed !== -1 && !(Number.isInteger(seed) && seed >= 0 && seed < SEED_SPACE))
    throw invalid(`request.seed must be an integer in [0, 2^32), got ${seed}`);
  const grammar = request.grammar !== undefined ? request.grammar : paramsGrammar;
  if (grammar !== undefined && grammar !== null && typeof grammar !== 'string')
    throw invalid('request.grammar must be a GBNF string');
  if (grammar && request.jsonSchema !== undefined) throw invalid('give grammar or jsonSchema, not both');
  return { params, seed: seed === -1 ? undefined : seed, grammar: grammar || null };
}

/** A seed to count on from: `seed` as checkSampling returns it, or a random one (none given). */
function seedBase(seed) {
  return seed === undefined ? Math.floor(Math.random() * SEED_SPACE) : seed;
}

/** What a program may hold unless it says: a few lines, and about what 4 requests of 256 tokens write. */
const DEFAULT_MAX_BRANCHES = 4;
const DEFAULT_MAX_CELLS = 1024;

/** `run(fn, options)`'s arguments checked against `ctx` (throws ERR_INVALID_ARG): its signal, leases, cells and seed. */
function checkRun(fn, options, ctx) {
  if (typeof fn !== 'function') throw invalid('run(program, options?): program must be a function (s) => ...');
  if (options === null || typeof options !== 'object')
    throw invalid('run(program, options?): options must be an object');
  const signal = signalOf({ signal: options.signal }, 'run');
  const maxBranches = positiveInt(options.maxBranches, 'options.maxBranches', DEFAULT_MAX_BRANCHES);
  if (maxBranches > ctx.nSeqMax)
    throw invalid(`options.maxBranches is ${maxBranches} but the context has nSeqMax ${ctx.nSeqMax}`);
  const maxCells = positiveInt(options.maxCells, 'options.maxCells', Math.min(DEFAULT_MAX_CELLS, ctx.nCtx));
  if (maxCells > ctx.nCtx) throw invalid(`options.maxCells is ${maxCells} but the context has nCtx ${ctx.nCtx}`);
  const { seed } = checkSampling({ seed: options.seed });
  return { signal, maxBranches, maxCells, seed: seedBase(seed) };
}

module.exports = {
  SEED_SPACE,
  seedBase,
  checkRun,
  invalid,
  positiveInt,
  isTokenIds,
  checkInput,
  checkStops,
  checkLogprobs,
  checkSampling,
};
