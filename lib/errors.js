'use strict';

/**
 * Errors in JavaScript. Native errors arrive with their stable `code` already set (Rust defines
 * every code and message, src/error.rs). This file holds the two things JS adds:
 *
 * - `makeError` for argument-shape checks that only JS can make (e.g. "expected a Branch")
 *   before anything reaches native code;
 * - the one shim for napi-rs's own argument conversion: napi-rs converts arguments in generated
 *   code before our Rust runs and throws with its status name as `code` ('InvalidArg',
 *   'NumberExpected', ...). `finishNativeErrors` renames those to ERR_INVALID_ARG, keeping the
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
  const finished = makeError('ERR_INVALID_ARG', `Invalid argument${method}: ${err.message}; check the argument types against index.d.ts`);
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
 * Finishes napi-rs conversion errors on every module function (camelCase exports) and every
 * method of every native class (the capitalised exports) of the binding.
 * @param {Record<string, any>} binding
 */
function finishNativeErrors(binding) {
  for (const [name, value] of Object.entries(binding)) {
    if (typeof value !== 'function') continue;
    if (/^[A-Z]/.test(name)) finishClassMethods(value);
    else binding[name] = finishThrows(value, name);
  }
}

/**
 * Wraps every method of a native class so a conversion error thrown by napi-rs is finished.
 * @param {Function} Class
 */
function finishClassMethods(Class) {
  const proto = Class.prototype;
  for (const name of Object.getOwnPropertyNames(proto)) {
    const desc = Object.getOwnPropertyDescriptor(proto, name);
    if (name === 'constructor' || typeof desc.value !== 'function') continue;
    desc.value = finishThrows(desc.value, name);
    Object.defineProperty(proto, name, desc);
  }
}

module.exports = { makeError, finishError, finishNativeErrors };
