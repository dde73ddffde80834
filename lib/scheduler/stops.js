'use strict';

/**
 * Stop strings over streamed text. Token pieces arrive one at a time and a stop string may span
 * several of them, so text that could still be the start of a stop string is held back until
 * the next piece decides it. What is released is never retracted.
 */
class StopMatcher {
  /** @param {string[]} stops non-empty strings */
  constructor(stops) {
    this.stops = stops;
    this.text = '';
    /** How much of `text` has been released. */
    this.released = 0;
    this.stopped = false;
  }

  /**
   * Appends a piece. Returns the newly released text; sets `stopped` when a stop string
   * completed (the text is then cut right before it and nothing more is released).
   */
  push(piece) {
    this.text += piece;
    let cut = -1;
    for (const s of this.stops) {
      // Released text was checked before: a match can only start in the held part.
      const at = this.text.indexOf(s, Math.max(0, this.released));
      if (at !== -1 && (cut === -1 || at < cut)) cut = at;
    }
    if (cut !== -1) {
      this.stopped = true;
      this.text = this.text.slice(0, cut);
      return this._releaseTo(cut);
    }
    return this._releaseTo(this.text.length - this._heldBack());
  }

  /** Releases everything still held (the generation ended without a stop string). */
  flush() {
    return this._releaseTo(this.text.length);
  }

  /** Length of the longest suffix of the unreleased text that is a proper prefix of a stop string. */
  _heldBack() {
    const open = this.text.length - this.released;
    let held = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, open); k > held; k--) {
        if (this.text.endsWith(s.slice(0, k))) {
          held = k;
          break;
        }
      }
    }
    return held;
  }

  _releaseTo(end) {
    const out = this.text.slice(this.released, end);
    this.released = Math.max(this.released, end);
    return out;
  }
}

module.exports = { StopMatcher };
