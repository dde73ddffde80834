'use strict';

/**
 * The Scheduler's own options (`new Scheduler(ctx, options)`), checked once with the defaults of
 * lib/defaults.js filled in. What one request or one program asks for is checked by ./request.js
 * and ./program.js.
 */

const defaults = require('../defaults');
const { positiveInt, invalid } = require('./checks');
const { DraftModel } = require('../speculative');
const { checkSpeculative, stepCostFor } = require('../decode/speculation');
const { makeError } = require('../errors');
const { jsonSchemaToGrammar } = require('../schema');
const { Branch } = require('../Branch');

const UNITS = { b: 1, k: 1e3, kb: 1e3, kib: 1024, m: 1e6, mb: 1e6, mib: 1024 ** 2, g: 1e9, gb: 1e9, gib: 1024 ** 3 };
Object.assign(UNITS, { t: 1e12, tb: 1e12, tib: 1024 ** 4 });

/**
 * A size in bytes from a number or a string such as '2GiB', '512MiB', '20GB', '1.5g'.
 * @param {unknown} value
 * @param {string} name the option, for the error
 * @returns {number}
 */
function parseBytes(value, name) {
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return Math.floor(value);
  const m = typeof value === 'string' ? /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(value) : null;
  const unit = m ? UNITS[(m[2] || 'b').toLowerCase()] : undefined;
  if (!m || unit === undefined)
    throw makeError(
      'ERR_INVALID_ARG',
      `${name} must be a size in bytes: a number or a string such as '2GiB' or '500MB'`,
    );
  return Math.floor(Number(m[1]) * unit);
}

/**
 * The checked options of a scheduler on `ctx` (`options` is an object; see SchedulerOptions).
 * `spec`, when it speculates: the draft source and `maxDraft`, with the step-cost fit that every
 * request's choices share.
 * @param {import('../Context').SessionContext} ctx
 * @param {import('../types').SchedulerOptions} options
 */
function schedulerOptions(ctx, options) {
  const o = { ...defaults.scheduler, onStep: null, ...options };
  const prefillChunk = positiveInt(o.prefillChunk, 'options.prefillChunk');
  const maxQueue = o.maxQueue === 0 ? 0 : positiveInt(o.maxQueue, 'options.maxQueue');
  const maxRunning = o.maxRunning === Infinity ? Infinity : positiveInt(o.maxRunning, 'options.maxRunning');
  const defaultMaxTokens = positiveInt(o.defaultMaxTokens, 'options.defaultMaxTokens');
  if (o.onStep !== null && typeof o.onStep !== 'function') throw invalid('options.onStep must be a function');
  if (typeof o.parseSpecial !== 'boolean') throw invalid('options.parseSpecial must be true or false');
  const budget = o.stepBudgetMs === undefined ? null : o.stepBudgetMs;
  if (budget !== null && !(typeof budget === 'number' && budget > 0 && Number.isFinite(budget)))
    throw invalid(`options.stepBudgetMs must be a positive number of milliseconds, or null for none (got ${budget})`);
  const spec = checkSpeculative(o.speculative, 'new Scheduler: options');
  if (spec && spec.source instanceof DraftModel) spec.source.checkVocabulary(ctx);
  return {
    tiers: cacheTiers(o),
    prefillChunk,
    maxQueue,
    maxRunning,
    defaultMaxTokens,
    onStep: o.onStep,
    parseSpecial: o.parseSpecial,
    stepBudgetMs: budget,
    spec: spec && { ...spec, cost: stepCostFor(ctx, spec.source) },
  };
}

/**
 * What each program of a scheduler on `ctx` is given (./program.js): its checked `options`'
 * defaults and speculation, and what all programs share — the prefix cache, the events, the
 * scheduler's counters, `wake` (a program has new work for the steps) and `decideOnLine` (a
 * line's `decide`: decisions are a client of lines, ../decisions); `newBranch`, where a line
 * with nothing cached starts (the one native call of a line's start that is not a fork).
 * @param {any} ctx
 * @param {ReturnType<typeof schedulerOptions>} options
 * @param {{ cache: any, events: any, counters: any, wake: () => void, decideOnLine: Function }} shared
 */
function programEnv(ctx, { defaultMaxTokens, spec, parseSpecial }, shared) {
  // A line with nothing cached starts from a new root (a prompt is never sampled: greedy).
  const newBranch = () => Branch.create(ctx, 0, { temperature: 0 });
  const { vocabSize } = ctx;
  return { ctx, vocabSize, defaultMaxTokens, jsonSchemaToGrammar, spec, parseSpecial, newBranch, ...shared };
}

/**
 * The prefix cache's RAM and disk tiers (`cacheRam`, `cacheDir`, `cacheDisk`, `onCacheWarning`),
 * or null when neither RAM nor a folder is given.
 */
function cacheTiers(o) {
  const ramBytes = parseBytes(o.cacheRam, 'options.cacheRam');
  const diskBytes = parseBytes(o.cacheDisk, 'options.cacheDisk');
  if (o.cacheDir !== undefined && o.cacheDir !== null && (typeof o.cacheDir !== 'string' || o.cacheDir === ''))
    throw invalid('options.cacheDir must be a folder path');
  if (o.onCacheWarning !== undefined && typeof o.onCacheWarning !== 'function')
    throw invalid('options.onCacheWarning must be a function');
  const dir = o.cacheDir || null;
  if (ramBytes === 0 && !dir) return null;
  const warn = o.onCacheWarning || ((message) => process.emitWarning(message, { code: 'LLAMA_BRANCH_CACHE' }));
  return { ramBytes, dir, diskBytes, warn };
}

module.exports = { schedulerOptions, programEnv, parseBytes };
