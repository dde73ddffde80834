'use strict';

/**
 * AbortSignal support for the long operations (decode, prefill, commit, decodeAndCaptureOne).
 * Each call given a signal gets its own native CancelToken: a signal aborted before the call
 * rejects at once; one aborted while the job is queued makes the job refuse to start; one aborted
 * while it runs stops llama.cpp at the next graph node. All reject with ERR_ABORTED and leave
 * every branch and sequence as it was before the call.
 */

const native = require('./native');
const { makeError } = require('./errors');

function isAbortSignal(s) {
  return (
    s !== null &&
    typeof s === 'object' &&
    typeof s.aborted === 'boolean' &&
    typeof s.addEventListener === 'function' &&
    typeof s.removeEventListener === 'function'
  );
}

/** The `signal` of an `{ signal }` options argument (undefined when absent). */
function signalOf(options, where) {
  if (options === undefined || options === null) return undefined;
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw makeError(
      'ERR_INVALID_ARG',
      `${where}: options must be an object such as { signal }, got ${Array.isArray(options) ? 'an array' : typeof options}`,
    );
  }
  const { signal } = options;
  if (signal === undefined || signal === null) return undefined;
  if (!isAbortSignal(signal))
    throw makeError(
      'ERR_INVALID_ARG',
      `${where}: options.signal must be an AbortSignal (e.g. new AbortController().signal)`,
    );
  return signal;
}

/** Gives an ERR_ABORTED error its recognisable name and the signal's reason as `cause`. */
function markAborted(err, signal) {
  err.name = 'AbortError';
  if (signal.reason !== undefined && err.cause === undefined) err.cause = signal.reason;
  return err;
}

function abortedError(where, signal) {
  return markAborted(
    makeError(
      'ERR_ABORTED',
      `${where} was aborted by its AbortSignal before it started; no branch or KV state changed, so retry it if it is still wanted`,
    ),
    signal,
  );
}

/**
 * Calls `start(token)` (a native async method taking a CancelToken or undefined) under the
 * `signal` of `options`. Argument errors of `options` are thrown synchronously, like the other
 * argument errors of these methods.
 */
function runCancellable(options, where, start) {
  const signal = signalOf(options, where);
  if (!signal) return start(undefined);
  if (signal.aborted) return Promise.reject(abortedError(where, signal));
  const token = new native.CancelToken();
  const onAbort = () => token.cancel();
  signal.addEventListener('abort', onAbort, { once: true });
  const done = () => signal.removeEventListener('abort', onAbort);
  let promise;
  try {
    promise = start(token);
  } catch (e) {
    done();
    throw e;
  }
  return promise.then(
    (value) => {
      done();
      return value;
    },
    (err) => {
      done();
      if (err && err.code === 'ERR_ABORTED') markAborted(err, signal);
      throw err;
    },
  );
}

module.exports = { runCancellable, signalOf };
