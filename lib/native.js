'use strict';

const { guardedView } = require('./errors');
const { loadBinary } = require('./loader');

/**
 * The default binding (lib/loader.js: LLAMA_BRANCH_BINARY, the source build, the platform
 * package), seen through `guardedView`: its functions throw ERR_INVALID_ARG for napi-rs
 * conversion errors. lib/ alone uses it; the public surface is lib/index.js.
 */
module.exports = guardedView(loadBinary());
