'use strict';

/**
 * `scheduler.run()`'s front door (docs/programs.md): the options checked, then a Program
 * (./program.js) whose lines the user's function drives through a root `ProgramLine`, within
 * the leases and cells it declared.
 */

const { ProgramLine } = require('../ProgramLine');
const { Program } = require('./program');
const { checkRun } = require('./checks');
const { rulesOf } = require('./doors');

/**
 * Checks `fn` and `options` (throws ERR_INVALID_ARG) and builds its program, ready at once; the
 * promise settles with what `fn` returns or throws. `door`: 'run', or 'decision' for a batch of a
 * decision (./doors.js: its `fn` also gets the `decision` event's sender, it resolves
 * `{ value, usage }` and may ask, with `options.hinted`, that its cache entries be kept warm).
 * @param {(s: ProgramLine, emit?: (fields: object) => void) => any} fn
 * @param {import('../types').RunOptions} options
 * @param {any} env what every program is given (./program.js)
 * @param {'run' | 'decision'} [door]
 * @returns {{ program: Program, promise: Promise<any> }}
 */
function runProgram(fn, options, env, door = 'run') {
  const rules = rulesOf(door);
  const { signal, maxBranches, maxCells, seed } = checkRun(fn, options, env.ctx);
  let settle = { resolve: (_value) => {}, reject: (_error) => {} };
  const promise = new Promise((resolve, reject) => (settle = { resolve, reject }));
  const program = new Program(env, {
    id: env.events.nextId('program'),
    signal,
    sink: {
      finish: ({ value }, usage) => settle.resolve(rules.withUsage ? { value, usage } : value),
      fail: settle.reject,
      doneUsage: (usage) => usage,
    },
    // What its lines will write is not known yet: no cached start is planned for it.
    budget: {
      prompt: null,
      cells: maxCells,
      leases: maxBranches,
      admit: { kind: 'program', maxBranches, maxCells },
    },
    door,
    hinted: rules.mayHint && Boolean(/** @type {any} */ (options).hinted),
    // Admitted: the function starts on a fresh root line.
    begin: (p) => {
      const root = new ProgramLine(p.freshLine([]), p);
      Promise.resolve()
        .then(() => (rules.sendsDecision ? fn(root, (fields) => p.events.emit('decision', fields)) : fn(root)))
        .then(
          (value) => p.end({ value }),
          (error) => p.end({ error }),
        )
        .then(p.wake);
    },
    seed,
  });
  return { program, promise };
}

module.exports = { runProgram };
