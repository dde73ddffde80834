'use strict';

/**
 * Errors in JavaScript. Native errors arrive with their stable `code` already set (Rust defines
 * every code and message, src/error.rs). This file holds the two things JS adds:
 *
 * - `makeError` for argument-shape checks that only JS can make (e.g. "expected a Branch")
 *   before anything reaches native code, and `invalidArg`, the one bad-argument error with the
 *   field it names (`param`) and a protocol's error type (`reason`);
 * - the one shim for napi-rs's own argument conversion: napi-rs converts arguments in generated
 *   code before our Rust runs and throws with its status name as `code` ('InvalidArg',
 *   'NumberExpected', ...). `guardedView` gives lib/ a view of a native object whose methods rename those to ERR_INVALID_ARG, keeping the
 *   original as `cause`. Methods that return a Promise take their arguments unconverted in
 *   Rust and reject instead, so they never throw here.
 */

/**
 * @param {string} code
 * @param {string} message
 * @returns {Error & { code: string }}
 */
function makeError(code, message, Ctor = Error) {
  const err = /** @type {Error & { code: string }} */ (new Ctor(message));
  err.code = code;
  return err;
}

/**
 * The one "bad argument" error of lib/ (checks, decisions, the server): ERR_INVALID_ARG whose
 * `param` names the field at fault (null: the whole input) and whose `reason` is the error type a
 * wire protocol reports (System One's `invalid_request`, `too_many_options`, ...); the server
 * answers it 400 with both.
 * @param {string} message
 * @param {string | null} [param]
 * @param {string} [reason]
 * @returns {Error & { code: string, param: string | null, reason: string }}
 */
function invalidArg(message, param = null, reason = 'invalid_request') {
  return Object.assign(makeError('ERR_INVALID_ARG', message), { param, reason });
}

function isOurCode(code) {
  return typeof code === 'string' && code.startsWith('ERR_');
}

/**
 * A napi-rs conversion error as ERR_INVALID_ARG; our own coded errors pass through.
 * @param {any} err
 * @param {string} [where]
 */
function finishError(err, where) {
  if (!(err instanceof Error) || isOurCode(/** @type {any} */ (err).code)) return err;
  const method = where ? ` to ${where.replace(/^_/, '')}()` : '';
  const finished = makeError(
    'ERR_INVALID_ARG',
    `Invalid argument${method}: ${err.message}; check the argument types against index.d.ts`,
  );
  finished.cause = err;
  return finished;
}

/**
 * `fn` with a conversion error thrown by napi-rs finished.
 * @template {(...args: any[]) => any} F
 * @param {F} fn
 * @param {string} name
 * @returns {F}
 */
function finishThrows(fn, name) {
  return /** @type {F} */ (
    /** @this {any} */
    function (...args) {
      try {
        return fn.apply(this, args);
      } catch (e) {
        throw finishError(e, name);
      }
    }
  );
}

/**
 * A view of a native object (a SessionContext, the binding module) whose every method finishes
 * napi-rs conversion errors and whose getters read through. The native object itself is left as
 * it is: nothing is patched.
 * @template T
 * @param {T} target
 * @returns {T}
 */
function guardedView(target) {
  const view = {};
  const seen = new Set(['constructor']);
  for (let o = /** @type {any} */ (target); o && o !== Object.prototype; o = Object.getPrototypeOf(o)) {
    for (const name of Object.getOwnPropertyNames(o)) {
      if (seen.has(name)) continue;
      seen.add(name);
      const desc = Object.getOwnPropertyDescriptor(o, name);
      if (typeof desc.value === 'function') {
        const method = desc.value;
        view[name] = /^[A-Z]/.test(name) ? method : finishThrows((...args) => method.apply(target, args), name);
      } else if (desc.get) {
        const get = desc.get;
        Object.defineProperty(view, name, { get: () => get.call(target), enumerable: true });
      } else {
        view[name] = desc.value;
      }
    }
  }
  return /** @type {T} */ (Object.freeze(view));
}

module.exports = { makeError, invalidArg, finishError, guardedView };
