'use strict';

/**
 * The one place native errors are finished for JavaScript. Rust encodes each error as
 * `[ERR_CODE] message` (napi-rs fixes the native error type); here the code moves to
 * `error.code`. napi-rs's own argument-conversion failures (wrong JS types) become
 * `ERR_INVALID_ARG`.
 */

const CODE_PREFIX = /^\[(ERR_[A-Z_]+)\] ([\s\S]*)$/;

function makeError(code, message, Ctor = Error) {
  const err = new Ctor(message);
  err.code = code;
  return err;
}

function finishError(err, where) {
  if (!(err instanceof Error)) return err;
  const m = CODE_PREFIX.exec(err.message);
  if (m) {
    err.code = m[1];
    err.message = m[2];
    if (typeof err.stack === 'string') err.stack = err.stack.replace(m[0].split('\n')[0], `${m[2].split('\n')[0]}`);
  } else if (typeof err.code !== 'string' || !err.code.startsWith('ERR_')) {
    // Status names such as InvalidArg, NumberExpected, StringExpected, ObjectExpected.
    const method = where ? ` to ${where.replace(/^_/, '')}()` : '';
    err.message = `Invalid argument${method}: ${err.message}; check the argument types against index.d.ts`;
    err.code = 'ERR_INVALID_ARG';
  }
  return err;
}

function isThenable(v) {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof v.then === 'function';
}

/**
 * Wraps every method and getter of a native class so its errors are finished once, here.
 * Methods named in `asyncMethods` return a Promise, so their argument errors reject it
 * instead of throwing synchronously.
 */
function finishNativeErrors(Class, asyncMethods = new Set()) {
  const proto = Class.prototype;
  for (const name of Object.getOwnPropertyNames(proto)) {
    if (name === 'constructor') continue;
    const desc = Object.getOwnPropertyDescriptor(proto, name);
    if (typeof desc.value === 'function') {
      const fn = desc.value;
      desc.value = function (...args) {
        let result;
        try {
          result = fn.apply(this, args);
        } catch (e) {
          if (asyncMethods.has(name)) return Promise.reject(finishError(e, name));
          throw finishError(e, name);
        }
        return isThenable(result) ? result.then(undefined, (e) => { throw finishError(e, name); }) : result;
      };
    } else if (typeof desc.get === 'function') {
      const get = desc.get;
      desc.get = function () {
        try {
          return get.call(this);
        } catch (e) {
          throw finishError(e, name);
        }
      };
    } else {
      continue;
    }
    Object.defineProperty(proto, name, desc);
  }
}

module.exports = { makeError, finishError, finishNativeErrors, isThenable };
