'use strict';

/**
 * One `scheduler.run()` (docs/programs.md): a program (./program.js) whose lines the user's
 * function drives through a root `ProgramLine`, within the leases and cells it declared.
 */

const { makeError } = require('../errors');
const { ProgramLine } = require('../ProgramLine');
const { Program } = require('./program');
const { positiveInt, invalid, checkSampling, SEED_SPACE } = require('./checks');
const { tooManyBranches } = require('./errors');

/** What a program may hold unless it says: a few lines, and about what 4 requests of 256 tokens write. */
const DEFAULT_MAX_BRANCHES = 4;
const DEFAULT_MAX_CELLS = 1024;

function abortedProgram(signal) {
  const err = makeError(
    'ERR_ABORTED',
    'the program was aborted by its AbortSignal; every line it held was released and no result is coming',
  );
  err.name = 'AbortError';
  if (signal && signal.reason !== undefined) err.cause = signal.reason;
  return err;
}

/** One `scheduler.run()`: the user's function over a root `ProgramLine`, and what it may hold. */
class RunProgram extends Program {
  /**
   * @param {(s: ProgramLine) => any} fn
   * @param {import('../types').RunOptions} options
   * @param {any} env see Program
   */
  constructor(fn, options, env) {
    if (typeof fn !== 'function') throw invalid('run(program, options?): program must be a function (s) => ...');
    if (options === null || typeof options !== 'object')
      throw invalid('run(program, options?): options must be an object');
    /** @type {{ finish: (value: any) => void, fail: (error: any) => void }} */
    const sink = { finish: () => {}, fail: () => {} };
    const promise = new Promise((resolve, reject) => Object.assign(sink, { finish: resolve, fail: reject }));
    super(env, 'program', options.signal, sink);
    this.promise = promise;
    const { ctx } = env;
    this.fn = fn;
    this.maxBranches = positiveInt(options.maxBranches, 'options.maxBranches', DEFAULT_MAX_BRANCHES);
    if (this.maxBranches > ctx.nSeqMax)
      throw invalid(`options.maxBranches is ${this.maxBranches} but the context has nSeqMax ${ctx.nSeqMax}`);
    this.maxCells = positiveInt(options.maxCells, 'options.maxCells', Math.min(DEFAULT_MAX_CELLS, ctx.nCtx));
    if (this.maxCells > ctx.nCtx)
      throw invalid(`options.maxCells is ${this.maxCells} but the context has nCtx ${ctx.nCtx}`);
    const { seed } = checkSampling({ seed: options.seed });
    this.seed = seed === undefined || seed === -1 ? Math.floor(Math.random() * SEED_SPACE) : seed;
  }

  nextSeed() {
    this.seed = (this.seed + 1) % SEED_SPACE;
    return this.seed;
  }

  /** Throws ERR_TOO_MANY_BRANCHES unless `n` more lines fit in `maxBranches`. */
  reserveLines(n) {
    const live = this.lines.filter((l) => l.state !== 'freed' && !l.collectable).length;
    if (live + n > this.maxBranches) throw tooManyBranches(this.maxBranches, live, n);
  }

  /**
   * What admitting the program takes: everything it declared (what its lines will write is not
   * known yet, so no cached start is planned for it).
   */
  needs() {
    return { entry: null, start: 0, cells: this.maxCells, leases: this.maxBranches };
  }

  admitted() {
    return { kind: 'program', maxBranches: this.maxBranches, maxCells: this.maxCells };
  }

  /** Admitted: the function starts on a fresh root line. */
  begin() {
    const root = new ProgramLine(this.freshLine([]), this);
    Promise.resolve()
      .then(() => this.fn(root))
      .then(
        (value) => this.end({ value }),
        (error) => this.end({ error }),
      )
      .then(this.wake);
  }

  /** Its signal fired: a queued program never starts, a running one ends. */
  abort() {
    const error = abortedProgram(this.signal);
    if (this.state === 'running') this.end({ error });
    else if (this.state === 'ready' || this.state === 'queued') this.reject(error);
  }

  /** The scheduler closes: the program ends with `error`. */
  close(error) {
    this.end({ error });
  }

  ending({ error }) {
    return { status: !error ? 'ok' : error.code === 'ERR_ABORTED' ? 'abort' : 'error', usage: this.usage };
  }

  result({ value }) {
    return value;
  }
}

module.exports = { RunProgram };
