'use strict';

const { Choice } = require('./choice');

/**
 * What `scheduler.generate()` returns: awaitable for the final result and async-iterable over
 * the events (`{choice, token, text}`, then one `{choice, token: null, text, finishReason}` per
 * choice). Events are kept from the start, so an iterator begun late still sees every event;
 * several iterators each see all of them. It is its request's Program's sink (./program.js): its
 * n choices feed it events, and the program settles it with `finish` or `fail`.
 */
class Generation {
  /**
   * @param {number} n the request's choices
   * @param {boolean} [showsDrafts] its usage counts draft tokens (it speculated; log-probabilities never do)
   */
  constructor(n = 1, showsDrafts = false) {
    this._n = n;
    this._showsDrafts = showsDrafts;
    /** @type {Choice[]} its choices, as its request began them */
    this._choices = [];
    this._events = [];
    this._waiters = [];
    this._settled = false;
    this._error = null;
    this._result = new Promise((resolve, reject) => {
      this._resolve = resolve;
      this._reject = reject;
    });
    // A caller that only iterates (or ignores the result) must not cause an unhandled rejection.
    this._result.catch(() => {});
  }

  /** A generation that failed before its request was queued (its input was refused). */
  static failed(error) {
    const gen = new Generation();
    gen.fail(error);
    return gen;
  }

  /** Its choice `index`, which sends its events here (`chat`: its reply parsed as it grows, ./chat.js). */
  choice(index, chat) {
    const choice = new Choice(index, (event) => this._push(event), chat);
    this._choices.push(choice);
    return choice;
  }

  /** The `done` event's usage: none when nothing was generated. */
  doneUsage(usage) {
    return usage.completionTokens > 0 ? this._shown(usage) : null;
  }

  /** Resolves with its choices and `usage` (a request aborted before it began: n choices ended 'abort'). */
  finish(_outcome, usage) {
    if (this._settled) return;
    if (this._choices.length === 0)
      for (let i = 0; i < this._n; i++) this.choice(i, null).end({ text: '', tokens: [], finishReason: 'abort' }, '');
    this._settled = true;
    this._resolve({ choices: this._choices.map((c) => c.result), usage: this._shown(usage) });
    this._wake();
  }

  fail(error) {
    if (this._settled) return;
    this._settled = true;
    this._error = error;
    this._reject(error);
    this._wake();
  }

  _shown(usage) {
    const { draftTokens, acceptedDraftTokens, ...rest } = usage;
    return this._showsDrafts ? { ...rest, draftTokens, acceptedDraftTokens } : rest;
  }

  _push(event) {
    this._events.push(event);
    this._wake();
  }

  _wake() {
    const waiters = this._waiters.splice(0);
    for (const w of waiters) w();
  }

  then(onFulfilled, onRejected) {
    return this._result.then(onFulfilled, onRejected);
  }

  catch(onRejected) {
    return this._result.catch(onRejected);
  }

  finally(onFinally) {
    return this._result.finally(onFinally);
  }

  async *[Symbol.asyncIterator]() {
    let next = 0;
    for (;;) {
      while (next < this._events.length) yield this._events[next++];
      if (this._settled) {
        if (this._error) throw this._error;
        return;
      }
      await new Promise((resolve) => this._waiters.push(resolve));
    }
  }
}

module.exports = { Generation };
