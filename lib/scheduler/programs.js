'use strict';

/**
 * The Scheduler's admitted programs (./program.js; requests too) and what their lines ask of
 * each step. The Scheduler's phases ask this, never a line: as each round of a step starts,
 * lines that need their KV get a branch (`materialize`), pending tokens are prefilled (`linesToPrefill`, `prefillEntries` for
 * the step's one prefill, then `applyPrefill`), and lines in a gen become the decode phase's rows
 * (`decodeRows`; `decode` over ../decode/rows.js, which returns what became of each row). This is
 * where a line hears what its row did, where its program hears what the line did (it started,
 * its tokens were prefilled) and where every failure is routed: the failing line's
 * program decides whose it is (a request fails whole), never the step's. It also knows whether
 * a lease or cells are free beyond what running programs may still take (`fits`), and the
 * counts of requests' prompts and of tokens taken that the Scheduler's `stats()` shows.
 */

const { produceAll, commitRows } = require('../decode/rows');
const { makeError } = require('../errors');

class Programs {
  /**
   * @param {{ cache: any, store: any, budget?: import('./step-budget').StepBudget | null }} scheduler
   *   the prefix cache (a fresh line's prompt may start from it or become an entry), the branch
   *   store whose leases and cells are shared, and the step budget extra lines are admitted by
   */
  constructor({ cache, store, budget = null }) {
    /** @type {import('./program').Program[]} */
    this.list = [];
    this.cache = cache;
    this.store = store;
    this.budget = budget;
    /** Requests' prompt tokens and those taken from the prefix cache (the hit rate). */
    this.promptTokens = 0;
    this.cachedPromptTokens = 0;
    /** Tokens taken by the gens of programs settled so far (running ones count their own). */
    this.settledCompletionTokens = 0;
    /** Whether `cellsFor` had to evict (warned once). */
    this.cellsWarned = false;
    /** @type {import('./step-plan').StepPlan | null} what the step in progress did, line by line */
    this.stepPlan = null;
  }

  /** From now on, what lines do is recorded in `plan` (null: the step ended). */
  record(plan) {
    this.stepPlan = plan;
  }

  get size() {
    return this.list.length;
  }

  /** Admitted requests (`maxRunning` counts them). */
  get requests() {
    return this.list.filter((p) => p.countsAsRunning).length;
  }

  /** The tokens each running program's fresh line waiting to start would start with (a restore may give them). */
  *freshStarts() {
    for (const [, line] of this.runningLines())
      if (line.state === 'waiting' && !line.lineStart.parent && line.needed)
        yield line.pending.slice(0, line.pending.length - line.scoring);
  }

  admit(program, need) {
    this.list.push(program);
    program.start(need);
  }

  hasWork() {
    return this.list.some((p) => p.hasWork());
  }

  /**
   * A prompt of `tokens` about to be admitted shares a run with a running request's prompt
   * line that has not got to the run's end (not begun, or still filling its entry): that line
   * cuts its prompt there too, when a lease is free for the cut, so the new prompt forks the
   * shared run once it is in instead of prefilling it again (a burst of prompts sharing a
   * prefix no cache point names: token prompts from a router, completions).
   */
  cutForShared(tokens, cache) {
    if (!this.fits(0, 1)) return;
    const filling = cache.fillingRun(tokens);
    // Programs admitted this step first: their prompt lines begin in admission order.
    for (const program of this.list) if (program.cutPromptFor(cache, tokens, filling)) return;
  }

  /** Whether `cells` and `leases` are free beyond what running programs may still take. */
  fits(cells, leases) {
    const freeCells = this.store.kvPressure().remaining - this.list.reduce((sum, p) => sum + p.cellsToCome(), 0);
    const freeLeases = this.store.available - this.list.reduce((sum, p) => sum + p.leasesToCome, 0);
    return freeCells >= cells && freeLeases >= leases;
  }

  /**
   * Demotes least-recently-used cached prefixes (never `keep`) until `cells` and `leases` are free
   * beyond what running programs may still take; false if they never are.
   */
  makeRoom(cells, leases, keep = null) {
    while (!this.fits(cells, leases)) if (!this.cache.evictOne(keep)) return false;
    return true;
  }

  /**
   * Before a decode that writes `cells` cells: evicts cached prefixes nobody pins while the KV
   * cells are short of them. Admission reserved every running program's cells, so this acts only
   * when a plan went wrong (a prefix a request counted on was gone by the time it started, so it
   * prefills more than it reserved); a cached prefix is worth less than the request it would fail.
   */
  cellsFor(cells) {
    if (this.store.kvPressure().remaining >= cells) return;
    // Under the test suites (test/helpers.js sets LLAMA_BRANCH_STRICT_KV) a plan that fell short fails loudly.
    if (process.env.LLAMA_BRANCH_STRICT_KV === '1')
      throw makeError('ERR_INTERNAL', `a step needed ${cells} KV cells that admission had not left free`);
    if (!this.cellsWarned) {
      // Admission should have made this room: say so once, so an accounting bug does not hide.
      this.cellsWarned = true;
      process.emitWarning(
        'llama-branch Scheduler: a step needed KV cells that admission had not left free; evicting cached prefixes (please report this)',
      );
    }
    while (this.store.kvPressure().remaining < cells) if (!this.cache.evictOne()) return;
  }

  /** Tokens taken by every gen so far (the Scheduler's `generatedTokens`). */
  get completionTokens() {
    return this.list.reduce((sum, p) => sum + p.tally.completionTokens, this.settledCompletionTokens);
  }

  /** At the start of a step: frees what programs released; settles the ones that ended and returns them. */
  async collect() {
    const prunes = [];
    const ended = this.list.filter((p) => p.collect(prunes));
    for (const p of ended) this.settledCompletionTokens += p.tally.completionTokens;
    if (ended.length > 0) this.list = this.list.filter((p) => !ended.includes(p));
    await Promise.all(prunes);
    for (const p of ended) p.settle();
    return ended;
  }

  /**
   * Right after `collect`: parks and resumes the lines whose `park()` / `resume()` wait (one
   * native call each, measured: what a park frees and a resume takes is what the program's cells
   * count, so admission never counts on a parked line's cells twice). A resume waits while its
   * program holds all its leases (a line released this step gives its lease back at the next); a
   * failure rejects that line's park or resume and changes nothing.
   */
  async moveLines() {
    for (const [program, line] of [...this.runningLines()]) {
      if (!line.moving || program.state !== 'running') continue;
      const job = /** @type {import('./jobs').MoveJob} */ (line.job);
      if (job.to === 'live' && program.leasesHeld >= program.maxBranches) continue;
      const cells = job.to === 'live' ? line.branch.parkedInfo.own : 0;
      if (cells > 0 && !program.checkCells(line, cells)) continue;
      if (cells > 0) this.cellsFor(cells);
      if (job.to === 'parked') line.lineStart.drop(this.cache); // an entry it was filling leaves the cache first
      const before = this.store.kvPressure().remaining;
      try {
        await (job.to === 'parked' ? line.branch.park() : line.branch.resume());
      } catch (e) {
        line.endJob(null, e);
        continue;
      }
      program.tally.moved(this.store.kvPressure().remaining - before);
      if (job.to === 'parked') line.parked();
      else line.resumed();
    }
  }

  /**
   * Each running program's lines, as `[program, line]`.
   * @returns {Generator<[import('./program').Program, import('./line').Line]>}
   */
  *runningLines() {
    for (const p of this.list) if (p.state === 'running') for (const line of p.lines) yield [p, line];
  }

  /**
   * Gives needed lines their branches (a failure fails the line's job, not the step): a line
   * waits while its program holds all the leases it declared (lines released this step hold
   * theirs until the next step frees them: it waits rather than take more than the program was
   * admitted with). A line whose own text is worth a cache entry opens one if a lease is spare.
   * While a request's first choice generates, a program's extra lines (its forks, a request's
   * later choices) wait while the step budget has no time for their rows, and start together
   * when it has: a program ends with its last line, so lines started one by one as rows leave
   * end later than all of them at once (bench/RESULTS.md, "Step budget"). With none generating,
   * the budget has nobody's token rate to keep and every line is admitted.
   */
  materialize() {
    // Counting lines is the budget's only: without one this loop stays as it was.
    const { rows: generating, interactive } =
      this.budget && this.budget.on ? this.generatingLines() : { rows: 0, interactive: 0 };
    const budget = interactive > 0 ? this.budget : null;
    let rows = generating;
    if (this.budget) this.budget.admitting();
    const extras = budget ? this.waitingExtras() : null;
    /** @type {Map<import('./program').Program, boolean>} each program's extra lines: admitted this round or not */
    const admitted = new Map();
    for (const [program, line] of this.runningLines()) {
      if (line.state !== 'waiting' || !line.needed || program.leasesHeld >= program.maxBranches) continue;
      if (line.extra && budget && extras) {
        if (!admitted.has(program)) admitted.set(program, budget.admitsAll(rows, extras.get(program) ?? 1));
        if (!admitted.get(program)) continue;
      }
      const starts = line.lineStart.starts;
      let error = null;
      try {
        line.materialize(() => this.fits(0, 1));
      } catch (e) {
        error = e;
      }
      if (line.lineStart.starts !== starts) this.countStart(program, line);
      if (error) program.lineFailed(line, error);
      else if (line.branch) {
        rows++; // it took its branch
        if (this.stepPlan) this.stepPlan.addBranch(line.id);
      }
    }
  }

  /** Each running program's extra lines waiting for a branch, as many as its leases let start now. */
  waitingExtras() {
    /** @type {Map<import('./program').Program, number>} */
    const extras = new Map();
    for (const [program, line] of this.runningLines())
      if (line.state === 'waiting' && line.needed && line.extra) extras.set(program, (extras.get(program) ?? 0) + 1);
    for (const [program, n] of extras)
      extras.set(program, Math.max(1, Math.min(n, program.maxBranches - program.leasesHeld)));
    return extras;
  }

  /**
   * Lines with a branch and a gen (decoding, or prefilling what they will decode from), and the
   * requests' first choices in a gen, with a branch or still waiting for one (the token rate a
   * step budget keeps).
   */
  generatingLines() {
    let [rows, interactive] = [0, 0];
    for (const [program, line] of this.runningLines()) {
      const kind = line.job && line.job.kind;
      if (kind !== 'gen' && kind !== 'peek') continue;
      if (line.state === 'live') rows++;
      if (program.countsAsRunning && !line.extra && (line.state === 'live' || line.state === 'waiting')) interactive++;
    }
    return { rows, interactive };
  }

  /** `line` started (even if its branch then failed): its program counts it; a request's prompt counts in the hit rate. */
  countStart(program, line) {
    program.tally.started(line.lineStart.cached);
    if (line !== program.promptLine) return;
    this.promptTokens += line.tokens.length;
    this.cachedPromptTokens += line.lineStart.cached;
  }

  /** Lines whose pending tokens are prefilled this step, `{program, line, take}`, within `budget` tokens. */
  linesToPrefill(budget) {
    const out = [];
    for (const [program, line] of this.runningLines()) {
      if (budget === 0 || !line.wantsPrefill) continue;
      let take = Math.min(line.pending.length, budget);
      // A prompt with images is prefilled by ./media.js: the text before it here, first.
      const media = line.lineStart.nextMedia(line.computed);
      if (media && line.computed >= media.at) continue;
      if (media) take = Math.min(take, media.at - line.computed);
      // A cache entry being filled ends where the next one starts: it is filled first.
      const end = line.lineStart.segmentEnd;
      if (end !== null) take = Math.min(take, end - line.computed);
      // A scored entry has a logits row per token and must fit one decode; a longer text to
      // score goes on in the next step (its first token scored from the logits left then).
      if (line.scoreFrom(take) !== undefined) {
        take = Math.min(
          take,
          program.ctx.nOutputs,
          program.ctx.nBatch,
          line.lineStart.nextForkPoint(line.computed) - line.computed,
        );
        if (take === 0) continue; // a fork waits for its lease where this line's KV ends
      }
      if (!program.checkCells(line, take)) continue;
      out.push({ program, line, take });
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
   * order), its program counting them first (forks whose parent reached its fork point just now
   * take their branches as the decode round starts). Returns the count of tokens prefilled.
   * @param {Array<{ program: import('./program').Program, line: import('./line').Line, take: number }>} lines
   * @param {Array<number[] | null>} scores
   */
  applyPrefill(lines, scores) {
    let tokens = 0;
    lines.forEach(({ program, line, take }, i) => {
      tokens += take;
      this.recordPrefill(line, take, scores[i] !== null && scores[i] !== undefined, false);
      program.countPrefill(line, take);
      try {
        line.prefilled(take, scores[i], () => this.fits(0, 1));
      } catch (e) {
        program.lineFailed(line, e); // e.g. no lease for a request's next segment after all
      }
    });
    return tokens;
  }

  /** `line` prefilled `tokens` this step (`scored`: with a logits row each; `image`: an image's positions). */
  recordPrefill(line, tokens, scored, image) {
    if (this.stepPlan) this.stepPlan.addPrefill(line.id, tokens, scored, image);
  }

  /** The step's prefill failed (all or nothing: no line advanced): each line's job fails with `error`. */
  prefillFailed(lines, error) {
    for (const { program, line } of lines) {
      line.lineStart.drop(this.cache);
      program.lineFailed(line, error);
    }
  }

  /**
   * The decode phase's rows: the lines in a gen (peeks are read here: nothing to decode), each
   * with its program, its gen and its owner (a request's rows fail together).
   */
  decodeRows() {
    const rows = [];
    for (const [program, line] of this.runningLines()) {
      if (!line.decoding) continue;
      if (line.job.kind === 'peek') {
        line.peek();
        continue;
      }
      const job = /** @type {import('./jobs').GenJob} */ (line.job);
      if (!program.checkCells(line, 1)) continue;
      try {
        job.arm(line.branch, line.tokens, program.env.spec);
      } catch (e) {
        program.lineFailed(line, e);
        continue;
      }
      rows.push({ program, line, job, branch: line.branch, owner: program.ownerOf(line), carried: job.next });
      if (this.stepPlan) this.stepPlan.addRow(line.id);
    }
    return rows;
  }

  /**
   * The decode of one step over `rows` (from `decodeRows`): ONE produce, each line takes its
   * token, ONE commit of those to decode (with drafts when `speculation` — the context and the
   * scheduler's speculation — is given: rows whose gen has a drafter draft; `GenJob.arm` gives
   * none to a gen that asks for log-probabilities), then each line hears what became of its row.
   * A failure goes to the line's program, once per row still live (a request's first failure
   * ends its other rows), and so does an error while a line takes its outcome (a draft model
   * that cannot follow): one owner's, never the step's. Returns the rows committed and the
   * draft tokens drafted and accepted.
   * @param {any} store
   * @param {ReturnType<Programs['decodeRows']>} rows
   * @param {{ ctx: any, spec: any } | null} speculation
   */
  async decode(store, rows, speculation) {
    const live = (/** @type {any} */ row) => row.line.job === row.job && row.line.decoding;
    const fail = (/** @type {any} */ row, /** @type {any} */ error) => {
      if (live(row)) row.program.lineFailed(row.line, error);
    };
    const produced = produceAll(store, rows);
    rows.forEach((row, i) => produced[i] instanceof Error && fail(row, produced[i]));
    const taken = rows.flatMap((row, i) =>
      live(row) && row.line.take(produced[i]) ? [{ row, token: produced[i].token }] : [],
    );
    const commits = taken.map(({ row: { branch, owner, job }, token }) => {
      // The last token comes from `next`, accepted without a decode, as without speculation.
      const limit = job.maxTokens - job.tokens.length - 1;
      return {
        branch,
        owner,
        token,
        spec: job.drafter ? { drafter: job.drafter, length: job.draftLength, limit } : undefined,
      };
    });
    const { outcomes, drafted, accepted, applied } = await commitRows(store, commits, speculation);
    outcomes.forEach((outcome, i) => {
      const { row, token } = taken[i];
      if (outcome.error) return fail(row, outcome.error);
      try {
        row.line.committed(token);
        if (outcome.verified && commits[i].spec && live(row)) row.line.verified({ token, ...outcome.verified });
      } catch (e) {
        fail(row, e);
      }
    });
    applied();
    return { committed: commits.length, drafted, accepted };
  }
}

module.exports = { Programs };
