'use strict';

/**
 * Warm-up of a context on a GPU. Vulkan compiles the pipelines a graph needs the first time a
 * graph of that shape runs (CUDA captures a graph per shape, Metal compiles its pipelines on
 * first use), so without this the first step at each new number of branches, and the first
 * prefill chunk of each size, stalls for up to seconds — a server that freezes whenever its
 * concurrency changes. A warm-up decodes one throwaway batch of each size class the context can
 * meet (src/engine/warmup.rs says which) on a scratch sequence, right after creation.
 *
 * It runs in the background: one queued decode at a time, so operations the program queues
 * meanwhile run between them, in call order. `ctx.ready` resolves when it is over (at once when
 * there is none); `ctx.warmup` reports progress. The driver keeps what it compiled in its own
 * disk cache (NVIDIA and Mesa do by default), so a later process warms up faster.
 */

const { makeError } = require('./errors');

/** @typedef {import('./types').WarmupOptions} WarmupOptions */
/** @typedef {import('./types').WarmupStatus} WarmupStatus */

/**
 * Batch sizes decoded again over a longer cache: the attention kernels (and how ggml splits
 * them) change with the cache length, not only with the batch.
 */
const STEP_SIZES_AT_LENGTH = [1, 2, 4, 8, 16, 32, 64];

/**
 * Cache lengths the default warm-up decodes `STEP_SIZES_AT_LENGTH` after: 1,024 cells and every
 * fourfold length after it that fits the context with the largest batch.
 * @param {number} nCtx
 * @param {number} largest
 */
function cacheLengths(nCtx, largest) {
  const lengths = [];
  for (let n = 1024; n + largest <= nCtx; n *= 4) lengths.push(n);
  return lengths;
}

/**
 * Checks `options.warmup` of createContext.
 * @param {unknown} option
 * @returns {boolean | 'auto' | WarmupOptions}
 */
function checkWarmupOption(option) {
  if (option === undefined) return 'auto';
  if (typeof option === 'boolean' || option === 'auto') return option;
  if (option !== null && typeof option === 'object' && !Array.isArray(option)) {
    const { maxTokens, onProgress, cacheLengths: lengths } = /** @type {WarmupOptions} */ (option);
    if (maxTokens !== undefined && !(Number.isInteger(maxTokens) && maxTokens >= 1))
      throw makeError('ERR_INVALID_ARG', `options.warmup.maxTokens must be a positive integer, got ${maxTokens}`);
    if (lengths !== undefined && !(Array.isArray(lengths) && lengths.every((n) => Number.isInteger(n) && n >= 1)))
      throw makeError('ERR_INVALID_ARG', 'options.warmup.cacheLengths must be an array of positive integers');
    if (onProgress !== undefined && typeof onProgress !== 'function')
      throw makeError('ERR_INVALID_ARG', 'options.warmup.onProgress must be a function');
    return /** @type {WarmupOptions} */ (option);
  }
  throw makeError(
    'ERR_INVALID_ARG',
    "options.warmup must be 'auto', true, false or { maxTokens?, cacheLengths?, onProgress? } (default 'auto': warm up when layers are on a GPU)",
  );
}

/**
 * Whether `'auto'` warms a context placed on `devices`: a local GPU compiles per shape; the
 * CPU does not, and an RPC server compiles on its own side (it warms its own contexts).
 * @param {string[]} devices
 */
function placedOnLocalGpu(devices) {
  return devices.some((name) => !/^RPC/i.test(name));
}

/**
 * The warm-up of one context.
 */
class Warmup {
  /** @type {WarmupStatus['state']} */
  #state = 'off';
  /** @type {Array<{ tokens: number, after: number, ms: number }>} */
  #sizes = [];
  #planned = 0;
  #started = 0;
  #ended = 0;
  /** @type {string | undefined} */
  #error;
  /** @type {Promise<WarmupStatus>} */
  ready;

  /**
   * Starts warming `native` up (or not, as `option` says).
   * @param {{ offload: { devices: string[] }, nCtx: number, _warmUpSizes(maxTokens?: number): number[], _warmUp(sizes: number[], after?: number): Promise<number[]> }} native
   * @param {boolean | 'auto' | WarmupOptions} option
   */
  constructor(native, option) {
    const wanted = option === 'auto' ? placedOnLocalGpu(native.offload.devices) : option !== false;
    if (!wanted) {
      this.ready = Promise.resolve(this.status);
      return;
    }
    const settings = typeof option === 'object' ? option : {};
    const sizes = native._warmUpSizes(settings.maxTokens);
    const largest = sizes.length ? sizes[sizes.length - 1] : 0;
    const after = settings.cacheLengths ?? cacheLengths(native.nCtx, largest);
    const stepSizes = STEP_SIZES_AT_LENGTH.filter((n) => n <= largest);
    /** @type {Array<{ sizes: number[], after: number }>} */
    const plan = [
      ...sizes.map((n) => ({ sizes: [n], after: 0 })),
      ...after.filter((a) => a + largest <= native.nCtx).map((a) => ({ sizes: stepSizes, after: a })),
    ];
    this.#planned = plan.reduce((t, p) => t + p.sizes.length, 0);
    this.#state = 'warming';
    this.#started = performance.now();
    this.ready = this.#run(native, plan, settings.onProgress);
  }

  /**
   * One queued operation per entry of the plan, each after the previous one finished (so the
   * program's own operations are not held behind the whole warm-up).
   * @param {{ _warmUp(sizes: number[], after?: number): Promise<number[]> }} native
   * @param {Array<{ sizes: number[], after: number }>} plan
   * @param {((progress: WarmupStatus) => void) | undefined} onProgress
   * @returns {Promise<WarmupStatus>}
   */
  async #run(native, plan, onProgress) {
    for (const { sizes, after } of plan) {
      let timings;
      try {
        timings = await native._warmUp(sizes, after);
      } catch (e) {
        const err = /** @type {{ code?: string, message: string }} */ (e);
        this.#state = err.code === 'ERR_CONTEXT_DISPOSED' ? 'cancelled' : 'failed';
        if (this.#state === 'failed') this.#error = `${err.code || 'Error'}: ${err.message}`;
        break;
      }
      sizes.forEach((tokens, i) => this.#sizes.push({ tokens, after, ms: Math.round(timings[i] * 100) / 100 }));
      if (onProgress) onProgress(this.status);
    }
    if (this.#state === 'warming') this.#state = 'ready';
    this.#ended = performance.now();
    return this.status;
  }

  /** @returns {WarmupStatus} */
  get status() {
    const end = this.#ended || performance.now();
    /** @type {WarmupStatus} */
    const status = {
      state: this.#state,
      done: this.#sizes.length,
      total: this.#planned,
      ms: this.#started ? Math.round(end - this.#started) : 0,
      sizes: this.#sizes.map((s) => ({ ...s })),
    };
    if (this.#error) status.error = this.#error;
    return status;
  }
}

module.exports = { Warmup, checkWarmupOption };
