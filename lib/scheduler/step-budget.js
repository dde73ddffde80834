'use strict';

/**
 * Fork admission by the step's time budget (issue 61; the scheduling result of TAPER, arXiv
 * 2605.06914: extra branches are admitted only within a step's slack). The Scheduler predicts a
 * decode step's time from its rows, fitted online to the steps it measured, and gives a
 * program's extra lines — its forks, a request's second and later choices — their branches only
 * while the step with their rows stays within `stepBudgetMs`, all of a program's waiting extra
 * lines together or none (./programs.js `materialize`: a program ends with its last line). Lines
 * that are not extra (a request's first choice, a program's root line) are never held back, so
 * interactive requests keep their token rate while branch-heavy programs fill the slack. A step
 * with no rows admits one program's extra lines whatever the budget, so every program makes
 * progress.
 */

const { DecayedLineFit } = require('../decode/line-fit');

/** How much a measured step's weight fades per later step (about the last 20 steps count). */
const DECAY = 0.95;

class StepBudget {
  /** @param {number | null} budgetMs null: no budget, every line is admitted at once */
  constructor(budgetMs) {
    this.budgetMs = budgetMs;
    /** Decode step time against rows. */
    this.fit = new DecayedLineFit(DECAY);
    /** Extra lines the last admission held back (`onStep`'s `deferred`). */
    this.deferred = 0;
  }

  /** A decode step of `rows` rows took `ms`. @param {number} rows @param {number} ms */
  observe(rows, ms) {
    if (this.budgetMs === null || rows <= 0) return;
    this.fit.observe(rows, ms);
  }

  /** Whether a budget is set (without one nothing is held back and nothing needs counting). */
  get on() {
    return this.budgetMs !== null;
  }

  /**
   * The predicted time of a decode step of `rows` rows: the fitted line `base + perRow · rows`
   * once the steps seen have varied in size, the mean time per row times `rows` before (an
   * overestimate where rows batch well, so admission starts cautious), 0 before any step.
   * @param {number} rows
   */
  predict(rows) {
    if (this.fit.n === 0) return 0;
    const line = this.fit.line();
    if (line && line.slope >= 0 && line.base >= 0) return line.base + line.slope * rows;
    const mean = this.fit.mean();
    return (mean.y / mean.x) * rows;
  }

  /** An admission round starts: nothing held back yet. */
  admitting() {
    this.deferred = 0;
  }

  /**
   * Whether an extra line may take its branch beside `rows` rows already in the step; counts
   * the ones held back.
   * @param {number} rows
   */
  admits(rows) {
    return this.admitsAll(rows, 1);
  }

  /**
   * Whether `count` extra lines of one program may take their branches together beside `rows`
   * rows already in the step (beside none, whatever the budget); counts them as held back if not.
   * @param {number} rows @param {number} count
   */
  admitsAll(rows, count) {
    if (this.budgetMs === null || rows === 0 || this.predict(rows + count) <= this.budgetMs) return true;
    this.deferred += count;
    return false;
  }
}

module.exports = { StepBudget };
