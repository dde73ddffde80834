'use strict';

/**
 * The Scheduler's queue: programs (requests too) waiting for admission, in arrival order, and
 * the three phases of a step that move them on — `prepare` (a request's chat template, between
 * steps), `restore` (a prefix the RAM or disk tier holds comes back into the KV cells for the
 * first that starts with one) and `admit` (FIFO while a program's worst case fits beside what
 * running ones may still take). The cache is asked in data (what it would restore, the best
 * start of a prompt); room is made by ./programs.js, which knows what running programs reserve.
 */

const { queueFullError, neverFitsError } = require('./errors');

class Queue {
  /** @type {import('./program').Program[]} queued and ready programs, in arrival order */
  #items = [];
  #maxQueue;
  #maxRunning;

  /** @param {{ maxQueue: number, maxRunning: number }} limits */
  constructor({ maxQueue, maxRunning }) {
    this.#maxQueue = maxQueue;
    this.#maxRunning = maxRunning;
  }

  get length() {
    return this.#items.length;
  }

  /** Queues `item`, or refuses it through its own promise (ERR_QUEUE_FULL); true: queued. */
  add(item) {
    if (this.#items.length >= this.#maxQueue) {
      item.reject(queueFullError(this.#maxQueue));
      return false;
    }
    this.#items.push(item);
    return true;
  }

  /** Takes `item` out (aborted); false if it was not queued. */
  remove(item) {
    const at = this.#items.indexOf(item);
    if (at !== -1) this.#items.splice(at, 1);
    return at !== -1;
  }

  /** Empties the queue and returns what it held. */
  takeAll() {
    return this.#items.splice(0);
  }

  /** Prepares queued programs in order (a request's chat template runs on the context's worker: here, between steps). */
  async prepare(ctx, systemPrompts) {
    for (const item of this.#items.filter((p) => p.state === 'queued')) {
      try {
        await item.prepare(ctx, systemPrompts);
        if (item.state === 'queued') item.to('ready'); // (an abort while it was prepared settled it)
      } catch (e) {
        if (!this.remove(item)) continue; // aborted (and settled) while it was prepared
        item.reject(e);
      }
    }
  }

  /**
   * The restore phase: the first start (ready requests, then running programs' fresh lines)
   * whose tokens begin with a prefix stored below the KV cells worth restoring gets it back, if
   * room can be made for it and what the request needs beside it. A request for which no room
   * can be made while nothing runs is admitted without it. One restore a step: admission pins
   * the request's entry right after, before anything could evict it. Returns the positions restored.
   * @param {import('./programs').Programs} programs
   * @param {import('./prefix-cache').PrefixCache} cache
   */
  async restore(programs, cache) {
    if (!cache.tiered) return 0;
    await cache.scan();
    for (const { tokens, program } of this.#restoreStarts(programs)) {
      const found = cache.restorable(tokens);
      if (!found) continue;
      const beside = program ? program.needsFrom(found.keep) : { cells: 0, leases: 0 };
      if (programs.makeRoom(found.keep + beside.cells, beside.leases + 1)) {
        const restored = await cache.promote(found.entry, found.keep, Boolean(program && program.hinted));
        return restored ? found.keep : 0;
      }
      if (program && programs.size === 0) program.skipRestore();
      return 0;
    }
    return 0;
  }

  /**
   * Who may start from a restored prefix, in order: ready requests (with the program, whose needs
   * beside it count), then running programs' fresh lines waiting to start (their program reserved
   * their cells: they need nothing beside).
   * @param {import('./programs').Programs} programs
   * @returns {Generator<{ tokens: number[], program?: import('./program').Program }>}
   */
  *#restoreStarts(programs) {
    for (const program of this.#items.filter((p) => p.state === 'ready' && p.restoreKey))
      yield { tokens: program.restoreKey, program };
    for (const tokens of programs.freshStarts()) yield { tokens };
  }

  /**
   * Admits ready programs in FIFO order while their worst case fits next to what running ones
   * may still need (at most `maxRunning` requests at once). A program that cannot fit even into
   * an empty context fails. Returns true when the head waits for a running program to give room
   * back (no step until something changes).
   * @param {import('./programs').Programs} programs
   * @param {import('./prefix-cache').PrefixCache} cache
   * @param {any} store
   */
  admit(programs, cache, store) {
    while (this.#items.length > 0) {
      const item = this.#items[0];
      if (item.state !== 'ready') return false;
      if (item.countsAsRunning && programs.requests >= this.#maxRunning) return false;
      const prompt = item.budget && item.budget.prompt;
      if (prompt && !prompt.media) programs.cutForShared(prompt.tokens, cache);
      const wanted = item.needs(cache);
      // A prompt the RAM or disk tier holds more of waits for its restore (one a step).
      if (item.restoreKey && cache.stored(item.restoreKey, wanted.start)) return false;
      const need = roomFor(programs, wanted);
      if (!need) {
        if (programs.size > 0) return true; // until a running one gives room back
        this.#items.shift();
        const least = withoutCut(wanted);
        item.reject(neverFitsError(least.cells, least.leases, store.kvPressure(), store.available));
        continue;
      }
      this.#items.shift();
      if (need.entry && need.start > 0) cache.startsFrom(need.entry, item.hinted);
      programs.admit(item, need);
    }
    return false;
  }
}

/**
 * `need` if room can be made for it, else the same without its extra cut (a cache entry is a
 * saving, never a reason to wait), else null.
 * @param {import('./programs').Programs} programs
 */
function roomFor(programs, need) {
  if (programs.makeRoom(need.cells, need.leases, need.entry)) return need;
  const without = withoutCut(need);
  return without !== need && programs.makeRoom(without.cells, without.leases, without.entry) ? without : null;
}

/** `need` without its extra cut and the lease the cut takes (itself when it has none). */
const withoutCut = (need) => (need.cut === null ? need : { ...need, cut: null, leases: need.leases - 1 });

module.exports = { Queue };
