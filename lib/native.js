'use strict';

const path = require('node:path');
const { finishNativeErrors } = require('./errors');
const { installRawMethods } = require('./raw');

/** Native methods that return a Promise (their argument errors become rejections). */
const ASYNC_METHODS = new Set([
  'tokenize', 'detokenize', 'decode', 'kvCacheClear', 'kvCacheRemove',
  '_branchDecodeAndCaptureOne', '_branchPrefill', '_storeCommit', '_storePrefill', '_benchRawGenerate',
  'formatChat', 'validateChatTemplate',
  'clearAndReseed', 'kvCacheSave', 'kvCacheLoad', 'kvCacheWriteFile', 'kvCacheReadFile', '_decodeAndCapture',
]);

/** Loads the addon built by `npm run build` (scripts/build.js) once per process. */
function load() {
  const file = process.env.LLAMA_BRANCH_BINARY || path.join(__dirname, '..', 'build', 'llama_branch.node');
  let binding;
  try {
    binding = require(file);
  } catch (e) {
    const err = new Error(`llama-branch: cannot load the native addon at ${file} (${e.message}). Build it with \`npm run build\`.`);
    err.code = 'ERR_NATIVE_LOAD';
    throw err;
  }
  finishNativeErrors(binding.SessionContext, ASYNC_METHODS);
  installRawMethods(binding.SessionContext);
  return binding;
}

module.exports = load();
