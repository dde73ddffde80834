'use strict';

const path = require('node:path');
const { finishNativeErrors } = require('./errors');
const { installRawMethods } = require('./raw');

/** Loads the addon built by `npm run build` (scripts/build.js) once per process. */
function load() {
  const file = process.env.LLAMA_BRANCH_BINARY || path.join(__dirname, '..', 'build', 'llama_branch.node');
  let binding;
  try {
    binding = require(file);
  } catch (e) {
    const err = new Error(`llama-branch: cannot load the native addon at ${file} (${e.message}). Build it with \`npm run build\`.`);
    err.code = 'ERR_NATIVE_LOAD';
    err.cause = e;
    throw err;
  }
  finishNativeErrors(binding);
  installRawMethods(binding.SessionContext);
  return binding;
}

module.exports = load();
