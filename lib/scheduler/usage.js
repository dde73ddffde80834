'use strict';

/**
 * What a program's lines used, counted as they work (./line.js; a freed line's counts stay): the
 * leases they took (a line's branch, a fork of each cache entry it filled), the KV cells they
 * hold (prefilled, then committed tokens, less what parked lines gave back: what `maxCells`
 * bounds), and the usage its result and `done` event report.
 */
class Tally {
  leases = 0;
  /** Tokens committed after sampling (prefilled ones are `prefilledCells`). */
  cells = 0;
  prefilledCells = 0;
  /** Cells parked lines gave back (less what resumed ones took again): free for its other lines. */
  returnedCells = 0;
  completionTokens = 0;
  draftTokens = 0;
  acceptedDraftTokens = 0;
  /** Its prompt's tokens (counted at admission), then every other line's as they are prefilled. */
  promptTokens = 0;
  /** Prompt tokens its lines' starts took from the prefix cache. */
  cachedPromptTokens = 0;

  /** Its prompt was admitted (its tokens count from now on). */
  admitted(promptTokens) {
    this.promptTokens = promptTokens;
  }

  /** A line started with `cached` prompt tokens from the prefix cache. */
  started(cached) {
    this.cachedPromptTokens += cached;
  }

  /** A line took a lease: its branch, or a fork of a cache entry it filled. */
  leaseTaken() {
    this.leases++;
  }

  /** `count` tokens were prefilled (`prompt`: the admitted prompt's, counted already). */
  tokensPrefilled(count, prompt) {
    this.prefilledCells += count;
    if (!prompt) this.promptTokens += count;
  }

  /** A gen took a token (sampled, or an accepted draft). */
  generated() {
    this.completionTokens++;
  }

  /** A speculative step drafted `drafted` tokens and `accepted` of them were taken. */
  drafted(drafted, accepted) {
    this.draftTokens += drafted;
    this.acceptedDraftTokens += accepted;
  }

  /** A taken token is in the KV now. */
  committed() {
    this.cells++;
  }

  /** A line was parked (`freed` cells came free) or resumed (`freed` < 0: cells taken again). */
  moved(freed) {
    this.returnedCells += freed;
  }

  get cellsUsed() {
    return this.prefilledCells + this.cells - this.returnedCells;
  }

  get usage() {
    const { promptTokens, cachedPromptTokens, completionTokens, draftTokens, acceptedDraftTokens } = this;
    return { promptTokens, cachedPromptTokens, completionTokens, draftTokens, acceptedDraftTokens };
  }
}

module.exports = { Tally };
