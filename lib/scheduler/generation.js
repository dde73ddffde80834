'use strict';

/**
 * What `scheduler.generate()` returns: awaitable for the final result and async-iterable over
 * the events (`{choice, token, text}`, then one `{choice, token: null, text, finishReason}` per
 * choice). Events are kept from the start, so an iterator begun late still sees every event;
 * several iterators each see all of them.
 */
class Generation {
  constructor() {
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
    /** What feeds the generation (its request's): events, then the result or the error. */
    this.sink = {
      push: (event) => this._push(event),
      finish: (result) => this._finish(result),
      fail: (e) => this._fail(e),
    };
  }

  /** A generation that failed before its request was queued (its input was refused). */
  static failed(error) {
    const gen = new Generation();
    gen.sink.fail(error);
    return gen;
  }

  _push(event) {
    this._events.push(event);
    this._wake();
  }

  _finish(result) {
    if (this._settled) return;
    this._settled = true;
    this._resolve(result);
    this._wake();
  }

  _fail(error) {
    if (this._settled) return;
    this._settled = true;
    this._error = error;
    this._reject(error);
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
