'use strict';

/**
 * The Scheduler's event stream: what happens to requests, programs and their branches, as plain
 * JSON objects in the trace format of docs/events.md (the same format `ctx.trace` writes for
 * scripts, `llama-branch serve` sends at GET /v1/events and records with --trace).
 *
 * Emitting costs nothing while nobody listens: every caller asks `on` before it builds an event
 * (some fields, e.g. a branch's perplexity, are read from the context only for a listener).
 * The format's shared pieces (version, clipped text, rounded perplexity) are lib/trace.js's.
 */

const { TRACE_VERSION, clipped, branchPerplexity, perplexityOf, roundedPerplexity } = require('../trace');

class SchedulerEvents {
  constructor() {
    /** @type {Set<(event: object) => void>} */
    this._listeners = new Set();
    this._requests = 0;
    this._programs = 0;
    /** The prefix cache's evictions as of the last `step` event (the next `evict` event counts the rest). */
    this._evictionsSeen = 0;
  }

  /** Whether anyone listens (emit nothing, read nothing extra, when not). */
  get on() {
    return this._listeners.size > 0;
  }

  /**
   * Calls `listener(event)` for every event from now on; returns the function that stops it.
   * A listener that throws is dropped (the scheduler never fails for an observer).
   * @param {(event: object) => void} listener
   * @returns {() => void}
   */
  subscribe(listener) {
    this._listeners.add(listener);
    return () => {
      this._listeners.delete(listener);
    };
  }

  /** An id for a new request (`r1`, `r2`, ...) or program (`p1`, ...), unique in this scheduler. */
  nextId(kind) {
    return kind === 'program' ? `p${++this._programs}` : `r${++this._requests}`;
  }

  /**
   * Sends `{ event: type, t, ...fields }` to every listener.
   * @param {string} type
   * @param {object} fields
   */
  emit(type, fields) {
    if (this._listeners.size === 0) return;
    const event = { event: type, t: Date.now(), ...fields };
    for (const listener of [...this._listeners]) {
      try {
        listener(event);
      } catch (e) {
        this._listeners.delete(listener);
        process.emitWarning(`a Scheduler event listener threw and was removed: ${e && e.message}`);
      }
    }
  }

  /**
   * The events of one scheduler step: an `evict` event when cached prefixes were evicted since
   * the last `step` event, then the `step` event, what the step did and the gauges after it.
   * @param {{ rows: number, prefillTokens: number, stepMs: number, plan?: import('./step-plan').StepPlan }} step what
   *   the step did (`plan`: line by line, ./step.js)
   * @param {import('../types').SchedulerStats} stats the scheduler's `stats()` after the step
   * @param {{ leasesUsed: number, nSeqMax: number, cacheTokens: number }} gauges what `stats()` leaves out
   */
  step({ rows, prefillTokens, stepMs, plan }, stats, { leasesUsed, nSeqMax, cacheTokens }) {
    const evicted = stats.evictions - this._evictionsSeen;
    this._evictionsSeen = stats.evictions;
    if (evicted > 0) this.emit('evict', { entries: evicted });
    this.emit('step', {
      step: stats.steps,
      rows,
      prefillTokens,
      stepMs: Math.round(stepMs * 100) / 100,
      running: stats.running + stats.programs,
      queued: stats.queued,
      cellsUsed: stats.cellsUsed,
      nCtx: stats.nCtx,
      leasesUsed,
      nSeqMax,
      cache: {
        entries: stats.cachedPrefixes,
        tokens: cacheTokens,
        hitRate: Math.round(stats.hitRate * 1000) / 1000,
        evictions: stats.evictions,
        ...(stats.cacheTiers ? { tiers: tierGauges(stats.cacheTiers) } : {}),
      },
      ...(plan ? { plan } : {}),
    });
  }
}

/**
 * One program's events, each carrying its id as `request`: the program and its lines say what
 * happened, this shapes what a listener gets.
 */
class ProgramEvents {
  /** @param {SchedulerEvents} events @param {string} id */
  constructor(events, id) {
    this.events = events;
    this.id = id;
  }

  get on() {
    return this.events.on;
  }

  emit(type, fields) {
    if (this.events.on) this.events.emit(type, { request: this.id, ...fields });
  }

  /** Line `branch` appended `text`, `n` its length after it. */
  append(branch, text, n) {
    if (this.events.on) this.emit('append', { branch, text: clipped(text), n });
  }

  /** Line `branch` scored `tokens` (forced, so no perplexity), `n` its length after them; their text only for a listener. */
  scored(branch, tokens, n, ctx) {
    if (this.events.on) this.token(branch, tokens.map((t) => ctx.tokenToText(t)).join(''), n, 'forced');
  }

  /** Line `branch`'s token, `n` its length with it; `mark`: 'draft' (an accepted draft token) or 'forced' (scored: no perplexity). */
  token(branch, text, n, mark, /** @type {any} */ native) {
    if (!this.events.on) return;
    const ppl = mark === 'forced' ? {} : { ppl: perplexityOf(native) };
    this.emit('token', { branch, text, n, ...ppl, ...(mark ? { [mark]: true } : {}) });
  }

  /** Line `branch`'s gen ended with `reason` at length `n`; `perplexity` as read (unrounded). */
  finish(branch, reason, n, perplexity) {
    if (this.events.on) this.emit('finish', { branch, reason, n, ppl: roundedPerplexity(perplexity) });
  }

  /** The started program's `done` event: how it ended, the usage its sink shows (null: none), its error. */
  done({ error, abort }, usage) {
    const status = error ? (error.code === 'ERR_ABORTED' ? 'abort' : 'error') : abort ? 'abort' : 'ok';
    const failed = error ? { error: { code: error.code || 'ERR_UNKNOWN', message: String(error.message) } } : {};
    this.emit('done', { status, ...(usage ? { usage: { ...usage } } : {}), ...failed });
  }
}

/** The prefix cache tiers' part of a `step` event: hits and bytes per tier, tokens restored. */
function tierGauges(t) {
  const { kvHits, ramHits, diskHits, ramBytes, diskBytes, restoredTokens, diskOn } = t;
  return { kvHits, ramHits, diskHits, ramBytes, diskBytes, restoredTokens, diskOn };
}

/** The largest image an `admit` event carries as a data URL; a larger one is a placeholder. */
const THUMBNAIL_MAX_BYTES = 64 * 1024;
/** The most data URLs one `admit` event carries (the rest are placeholders). */
const THUMBNAILS_PER_REQUEST = 4;
/**
 * The media type of image file bytes by their signature (the formats the projector decodes).
 * @type {[string, number[]][]}
 */
const SIGNATURES = [
  ['image/png', [0x89, 0x50, 0x4e, 0x47]],
  ['image/jpeg', [0xff, 0xd8, 0xff]],
  ['image/gif', [0x47, 0x49, 0x46, 0x38]],
  ['image/bmp', [0x42, 0x4d]],
];

/** The media type of image file bytes (null: none of the formats above, nor WebP). */
function mediaTypeOf(/** @type {Uint8Array} */ bytes) {
  const head = Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(12, bytes.length)).toString('latin1');
  if (head.startsWith('RIFF') && head.slice(8) === 'WEBP') return 'image/webp'; // a RIFF container of form WEBP
  const found = SIGNATURES.find(([, sig]) => sig.every((b, k) => bytes[k] === b));
  return found ? found[0] : null;
}

/**
 * The `images` field of a request's `admit` event (docs/events.md): per image of its prompt, in
 * order, `{ id, nPos }` (`id`: the first 16 hex digits of the SHA-256 of its file bytes), with
 * `bytes` when its bytes were given (not for `{ imagePath }` or a MediaPrompt), and `url`, a
 * data URL of the file, for the first THUMBNAILS_PER_REQUEST images of at most
 * THUMBNAIL_MAX_BYTES: the page draws those as thumbnails and the others as placeholders, so the
 * event stream never carries megabytes.
 * @param {import('../Context').MediaPrompt} media the prompt, tokenized
 * @param {any} sources what it was tokenized from: prompt parts (strings, bytes, `{ image }`,
 *   `{ imagePath }`, `{ text }`) whose image parts are its images in order, or anything else
 */
function imagesOfPrompt(media, sources) {
  const pieces = media.pieces.filter((p) => p.type === 'image');
  const given = Array.isArray(sources)
    ? sources
        .filter((p) => p instanceof Uint8Array || (p !== null && typeof p === 'object' && (p.image || p.imagePath)))
        .map((p) => (p instanceof Uint8Array ? p : p.image instanceof Uint8Array ? p.image : null))
    : [];
  const bytesOf = (i) => (given.length === pieces.length ? given[i] : null);
  let urls = 0;
  return pieces.map((piece, i) => {
    const image = { id: piece.id.slice(0, 16), nPos: piece.nPos };
    const bytes = bytesOf(i);
    if (!bytes) return image;
    const type = mediaTypeOf(bytes);
    if (!type || bytes.length > THUMBNAIL_MAX_BYTES || urls >= THUMBNAILS_PER_REQUEST)
      return { ...image, bytes: bytes.length };
    urls++;
    const url = `data:${type};base64,${Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('base64')}`;
    return { ...image, bytes: bytes.length, url };
  });
}

module.exports = {
  SchedulerEvents,
  ProgramEvents,
  TRACE_VERSION,
  THUMBNAIL_MAX_BYTES,
  clipped,
  branchPerplexity,
  perplexityOf,
  roundedPerplexity,
  imagesOfPrompt,
};
