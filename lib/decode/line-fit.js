'use strict';

/**
 * A straight line `y = base + slope · x` fitted by least squares to observations whose weight
 * fades by `decay` per later one: what a step's time is against its rows. The speculation's
 * step-cost fit (./speculation.js `StepCost`) and the Scheduler's step budget
 * (../scheduler/step-budget.js) each keep one and read it their own way.
 */
class DecayedLineFit {
  /** @param {number} decay the weight an observation keeps per later one (0..1) */
  constructor(decay) {
    this.decay = decay;
    /** The observations' total weight. */
    this.n = 0;
    this.sx = 0;
    this.sy = 0;
    this.sxx = 0;
    this.sxy = 0;
  }

  /** @param {number} x @param {number} y */
  observe(x, y) {
    const d = this.decay;
    this.n = this.n * d + 1;
    this.sx = this.sx * d + x;
    this.sy = this.sy * d + y;
    this.sxx = this.sxx * d + x * x;
    this.sxy = this.sxy * d + x * y;
  }

  /** The weighted means of x and y (NaN before any observation). */
  mean() {
    return { x: this.sx / this.n, y: this.sy / this.n };
  }

  /**
   * `{ base, slope }`, or null while there are fewer than 4 observations or their x have not
   * varied enough (a variance under 0.25) to tell a slope.
   */
  line() {
    if (this.n < 4) return null;
    const { x, y } = this.mean();
    const variance = this.sxx / this.n - x * x;
    if (variance < 0.25) return null;
    const slope = (this.sxy / this.n - x * y) / variance;
    return { base: y - slope * x, slope };
  }
}

module.exports = { DecayedLineFit };
