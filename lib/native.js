'use strict';

const { finishNativeErrors } = require('./errors');
const { installRawMethods } = require('./raw');
const { loadBinary, whenLoaded } = require('./loader');

// Every binding the loader loads (the default one below, GPU variants later) gets the same finish.
whenLoaded((binding) => {
  finishNativeErrors(binding);
  installRawMethods(binding.SessionContext);
});

/** The default binding (lib/loader.js: LLAMA_BRANCH_BINARY, the source build, the platform package). */
module.exports = loadBinary();
