'use strict';

/**
 * The error codes the Scheduler and the server add to the package's error contract, and the
 * Scheduler's errors with their messages, defined in one place. Everything else reuses the
 * existing codes (ERR_INVALID_ARG, ERR_ABORTED, ERR_KV_FULL, ...).
 */

const { makeError } = require('../errors');

const SchedulerErrorCode = Object.freeze({
  /** The scheduler's waiting queue holds `maxQueue` requests already. */
  QUEUE_FULL: 'ERR_QUEUE_FULL',
  /** `generate()` after `close()`, or a request still queued/running when `close()` was called. */
  SCHEDULER_CLOSED: 'ERR_SCHEDULER_CLOSED',
  /** A program's `fork` would hold more lines than its `maxBranches`. */
  TOO_MANY_BRANCHES: 'ERR_TOO_MANY_BRANCHES',
  /** A program line used while busy with a gen, after `release()`, or after its program ended. */
  PROGRAM_STATE: 'ERR_PROGRAM_STATE',
});

/** An Error with one of the codes above (or an existing package code) and a message saying what to do. */
function schedulerError(code, message) {
  return makeError(code, message);
}

function closedError(started = true) {
  return schedulerError(
    SchedulerErrorCode.SCHEDULER_CLOSED,
    started
      ? 'the scheduler was closed; create a new Scheduler for new requests'
      : 'the scheduler was closed before this request started',
  );
}

function queueFullError(maxQueue) {
  return schedulerError(
    SchedulerErrorCode.QUEUE_FULL,
    `the scheduler's queue is full (maxQueue ${maxQueue} requests wait already); retry later or raise maxQueue`,
  );
}

/** A request or program that cannot fit even into a context with every cached prefix evicted. */
function neverFitsError(cells, leases, pressure, available) {
  return makeError(
    'ERR_KV_FULL',
    `the request does not fit even with every cached prefix evicted (needs ${cells} cells and ${leases} leases; ${pressure.remaining} of ${pressure.nCtx} cells and ${available} leases are free): lower maxTokens or n (maxCells or maxBranches for a program), or create the context with a larger nCtx / nSeqMax`,
  );
}

/** A program's fork or select would hold more lines than it declared. */
function tooManyBranches(maxBranches, live, n) {
  return schedulerError(
    SchedulerErrorCode.TOO_MANY_BRANCHES,
    `${n} more lines would make ${live + n} but the program declared maxBranches ${maxBranches}; release lines you no longer need (line.release()) or pass a larger maxBranches to run()`,
  );
}

/** A program's gen or prefill of `more` cells would pass its maxCells. */
function cellsExceeded(used, more, maxCells) {
  return makeError(
    'ERR_KV_FULL',
    `the program has written ${used} KV cells and ${more} more would pass its maxCells ${maxCells}; release lines sooner, lower maxTokens, or pass a larger maxCells to run()`,
  );
}

/** A program asked to move from state `from` to `to`, which its life cycle does not allow: a bug of ours. */
function noTransition(from, to) {
  return makeError('ERR_INTERNAL', `Scheduler program: no transition from ${from} to ${to}; please report this bug`);
}

/** A program's AbortSignal fired (a request's resolves instead: its choices end 'abort'). */
function abortedProgram(signal) {
  const err = makeError(
    'ERR_ABORTED',
    'the program was aborted by its AbortSignal; every line it held was released and no result is coming',
  );
  err.name = 'AbortError';
  if (signal && signal.reason !== undefined) err.cause = signal.reason;
  return err;
}

module.exports = {
  abortedProgram,
  noTransition,
  SchedulerErrorCode,
  schedulerError,
  closedError,
  queueFullError,
  neverFitsError,
  tooManyBranches,
  cellsExceeded,
};
