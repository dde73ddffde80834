'use strict';

/**
 * The three front doors a program comes through, one closed value (`door`), and what each means
 * for the program it builds (./program.js reads only these rules, never the name):
 * - 'request' (`generate()`, ./request.js): counts against `maxRunning` and in `stats().running`;
 *   a line's failure fails it whole; at an abort or close its open gens end 'abort' and it
 *   resolves; all its lines are made at admission (`planned`: it reserves only what they may still
 *   take, and ends when none has a job left).
 * - 'run' (`run()`, ./run.js): the user's function makes its lines: it holds all it declared until
 *   the function ends; a line's failure rejects that line's job; at an abort or close its open
 *   jobs and it reject.
 * - 'decision' (a batch of `decide()`, ../decisions): a 'run' program whose function also gets its
 *   `decision` event's sender, that resolves `{ value, usage }` (its cached tokens are the
 *   decision's) and may ask that the cache entries it starts from or fills be kept warm
 *   (`mayHint`: a prompt_cache_key).
 */

/**
 * @typedef {'request' | 'run' | 'decision'} Door
 * @typedef {{ countsAsRunning: boolean, failsWhole: boolean, endsOpen: 'abort' | 'reject', planned: boolean,
 *   sendsDecision: boolean, withUsage: boolean, mayHint: boolean }} DoorRules
 */

const RUN = { countsAsRunning: false, failsWhole: false, endsOpen: /** @type {'reject'} */ ('reject'), planned: false };
const UNTYPED = { sendsDecision: false, withUsage: false, mayHint: false };

/** @type {Readonly<Record<Door, Readonly<DoorRules>>>} */
const DOORS = Object.freeze({
  request: Object.freeze({ countsAsRunning: true, failsWhole: true, endsOpen: 'abort', planned: true, ...UNTYPED }),
  run: Object.freeze({ ...RUN, ...UNTYPED }),
  decision: Object.freeze({ ...RUN, sendsDecision: true, withUsage: true, mayHint: true }),
});

/**
 * The rules of `door`; an unknown one is a programming error (no user value reaches here).
 * @param {Door} door
 * @returns {Readonly<DoorRules>}
 */
function rulesOf(door) {
  const rules = DOORS[door];
  if (!rules) throw new TypeError(`unknown program door: ${door}`);
  return rules;
}

module.exports = { rulesOf };
