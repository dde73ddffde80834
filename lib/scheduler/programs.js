'use strict';

/**
 * The Scheduler's admitted programs (./program.js; requests too) and what their lines ask of
 * each step. The Scheduler's phases ask this, never a line: lines that need their KV get a
 * branch (`materialize`), pending tokens are prefilled (`linesToPrefill`, `prefillEntries` for
 * the step's one prefill, then `prefilled`), and lines in a gen become the decode phase's rows
 * (`decodeRows`, over ./rows.js). A failure found here is the failing line's (its owner's: a
 * request fails whole), never the step's.
 */

const { lineRow } = require('./rows');

class Programs {
  /**
   * @param {{ cache: any, createBranch: () => any, spareLease: () => boolean }} scheduler what a
   *   line needs from the Scheduler to get its branch: the prefix cache (a fresh line's prompt may
   *   start from it or become an entry), a new root branch, and whether one more lease is free
   *   beyond what running programs may still take
   */
  constructor({ cache, createBranch, spareLease }) {
    /** @type {import('./program').Program[]} */
    this.list = [];
    this.cache = cache;
    this.createBranch = createBranch;
    this.spareLease = spareLease;
  }

  get size() {
    return this.list.length;
  }

  admit(program, need) {
    this.list.push(program);
    program.start(need);
  }

  hasWork() {
    return this.list.some((p) => p.hasWork());
  }

  /** At the start of a step: frees what programs released; settles the ones that ended. */
  async collect() {
    const prunes = [];
    const ended = this.list.filter((p) => p.collect(prunes));
    if (ended.length > 0) this.list = this.list.filter((p) => !ended.includes(p));
    await Promise.all(prunes);
    for (const p of ended) p.settle();
  }

  *runningLines() {
    for (const p of this.list) if (p.state === 'running') yield* p.lines;
  }

  /** Gives needed lines their branches (a failure fails the line's job, not the step). */
  materialize() {
    for (const line of this.runningLines()) {
      try {
        line.materialize(this.cache, this.createBranch, this.spareLease);
      } catch (e) {
        line.fail(e);
      }
    }
  }

  /** Lines whose pending tokens are prefilled this step, `{line, take}`, within `budget` tokens. */
  linesToPrefill(budget) {
    this.materialize();
    const out = [];
    for (const line of this.runningLines()) {
      if (budget === 0 || !line.wantsPrefill) continue;
      const program = line.program;
      let take = Math.min(line.pending.length, budget);
      // A cache entry being filled ends where the next one starts: it is filled first.
      if (line.segment) take = Math.min(take, line.segment.tokens.length - line.filled);
      // A scored entry has a logits row per token and must fit one decode; a longer text to
      // score goes on in the next step (its first token scored from the logits left then).
      if (line.scoreFrom(take) !== undefined) {
        take = Math.min(take, program.ctx.nOutputs, program.ctx.nBatch, line.nextForkPoint() - line.filled);
        if (take === 0) continue; // a fork waits for its lease where this line's KV ends
      }
      if (program.cellsUsed + take > program.maxCells) {
        line.fail(program.cellsExceeded(take));
        continue;
      }
      out.push({ line, take });
      budget -= take;
    }
    return out;
  }

  /**
   * The prefill entries of `lines` (from `linesToPrefill`): `[branch, tokens]`, with a third
   * item, where scoring starts, for a select's option (scored in the same decode).
   * @param {Array<{ line: import('./line').Line, take: number }>} lines
   * @returns {Array<[any, number[]] | [any, number[], number]>}
   */
  prefillEntries(lines) {
    return lines.map(({ line, take }) => {
      const scoreFrom = line.scoreFrom(take);
      const tokens = line.pending.slice(0, take);
      return scoreFrom === undefined ? [line.branch, tokens] : [line.branch, tokens, scoreFrom];
    });
  }

  /**
   * After the step's prefill: each of `lines` takes its tokens and their `scores` (in the same
   * order); forks whose parent reached its fork point just now get their branches. Returns the
   * count of tokens prefilled.
   * @param {Array<{ line: import('./line').Line, take: number }>} lines
   * @param {Array<number[] | null>} scores
   */
  prefilled(lines, scores) {
    let tokens = 0;
    lines.forEach(({ line, take }, i) => {
      tokens += take;
      try {
        line.prefilled(take, this.cache, scores[i], this.spareLease);
      } catch (e) {
        line.fail(e); // e.g. no lease for a request's next segment after all
      }
    });
    this.materialize();
    return tokens;
  }

  /** The step's prefill failed (all or nothing: no line advanced): each line's job fails with `error`. */
  prefillFailed(lines, error) {
    for (const { line } of lines) {
      line.dropSegment(this.cache);
      line.fail(error);
    }
  }

  /**
   * The decode phase's rows of lines in a gen (peeks are read here: nothing to decode);
   * `onToken()` counts each token sampled. A row speculates when the scheduler does and its gen
   * asks for no log-probabilities.
   */
  decodeRows(onToken) {
    const rows = [];
    for (const line of this.runningLines()) {
      if (!line.decoding) continue;
      if (line.job.kind === 'peek') {
        line.peek();
        continue;
      }
      const job = /** @type {import('./jobs').GenJob} */ (line.job);
      const program = line.program;
      const fail = (e) => line.fail(e);
      if (program.cellsUsed >= program.maxCells) {
        fail(program.cellsExceeded(1));
        continue;
      }
      try {
        job.arm(line, program.spec);
      } catch (e) {
        fail(e);
        continue;
      }
      rows.push(lineRow(line, job, onToken, fail));
    }
    return rows;
  }
}

module.exports = { Programs };
