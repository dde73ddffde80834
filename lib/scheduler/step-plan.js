'use strict';

/**
 * What one Scheduler step did, line by line, as data (`onStep`'s and the `step` event's `plan`):
 * the lines that took their branches, what each prefilled (`scored`: a logits row per token;
 * `image`: an image's positions) and which decoded a row, with the positions restored from RAM or
 * disk. Ids are the events' (`p1.0`, ...). ./programs.js fills it as the step's phases run.
 */
class StepPlan {
  /** @type {string[]} */ branches = [];
  /** @type {{ line: string, tokens: number, scored: boolean, image: boolean }[]} */ prefill = [];
  /** @type {string[]} */ decode = [];
  restored = 0;

  /** Line `id` took its branch. */
  addBranch(id) {
    this.branches.push(id);
  }

  /** Line `id` prefilled `tokens`. */
  addPrefill(id, tokens, scored, image) {
    this.prefill.push({ line: id, tokens, scored, image });
  }

  /** Line `id` has a row in the decode. */
  addRow(id) {
    this.decode.push(id);
  }

  /** `positions` came back from RAM or disk. */
  setRestored(positions) {
    this.restored = positions;
  }
}

module.exports = { StepPlan };
