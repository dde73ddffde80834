'use strict';

/**
 * The error codes the Scheduler and the server add to the package's error contract, defined in
 * one place (to be folded into lib/errors.js). Everything else reuses the existing codes
 * (ERR_INVALID_ARG, ERR_ABORTED, ERR_KV_FULL, ...).
 */

const { makeError } = require('../errors');

const SchedulerErrorCode = Object.freeze({
  /** The scheduler's waiting queue holds `maxQueue` requests already. */
  QUEUE_FULL: 'ERR_QUEUE_FULL',
  /** `generate()` after `close()`, or a request still queued/running when `close()` was called. */
  SCHEDULER_CLOSED: 'ERR_SCHEDULER_CLOSED',
});

/** An Error with one of the codes above (or an existing package code) and a message saying what to do. */
function schedulerError(code, message) {
  return makeError(code, message);
}

module.exports = { SchedulerErrorCode, schedulerError };
