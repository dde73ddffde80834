'use strict';

/**
 * JS-side members of SessionContext for raw decoding. `decodeAndCapture` checks the caller's
 * buffer before anything is queued; the native `_decodeAndCapture` decodes and copies the logits
 * on the worker in one job (so no later operation can slip in between), and the copy lands in
 * the caller's buffer here, on the JS thread.
 */

const { makeError } = require('./errors');

/** `dest` as a Float32Array of exactly `n` floats, or an ERR_INVALID_ARG error. */
function captureTarget(dest, n) {
  if (dest instanceof Float32Array) {
    if (dest.length < n) throw makeError('ERR_INVALID_ARG', `decodeAndCapture: dest holds ${dest.length} floats; it needs at least vocabSize = ${n}`);
    return dest.subarray(0, n);
  }
  if (dest instanceof ArrayBuffer) {
    if (dest.byteLength < n * 4) throw makeError('ERR_INVALID_ARG', `decodeAndCapture: dest holds ${dest.byteLength} bytes; it needs at least vocabSize * 4 = ${n * 4}`);
    return new Float32Array(dest, 0, n);
  }
  throw makeError('ERR_INVALID_ARG', 'decodeAndCapture: dest must be a Float32Array or an ArrayBuffer of at least vocabSize floats');
}

function installRawMethods(SessionContext) {
  /** Raw decode, then an independent copy of the last token's logits into `dest`. */
  SessionContext.prototype.decodeAndCapture = async function decodeAndCapture(tokens, position, seqId, dest) {
    const n = this.vocabSize;
    captureTarget(dest, n);
    const row = await this._decodeAndCapture(tokens, position, seqId);
    // Checked again: the caller may have transferred or detached `dest` while the decode ran.
    captureTarget(dest, n).set(row);
  };
}

module.exports = { installRawMethods };
