'use strict';

const { finishNativeErrors } = require('./errors');
const { installRawMethods } = require('./raw');
const { loadBinary, whenLoaded } = require('./loader');

/** Native methods that return a Promise (their argument errors become rejections). */
const ASYNC_METHODS = new Set([
  'tokenize', 'detokenize', 'decode', 'kvCacheClear', 'kvCacheRemove', 'encode',
  '_branchDecodeAndCaptureOne', '_branchPrefill', '_storeCommit', '_storePrefill', '_benchRawGenerate',
  'formatChat', 'validateChatTemplate',
  'clearAndReseed', 'kvCacheSave', 'kvCacheLoad', 'kvCacheWriteFile', 'kvCacheReadFile', '_decodeAndCapture',
]);

// Every binding the loader loads (the default one below, GPU variants later) gets the same finish.
whenLoaded((binding) => {
  finishNativeErrors(binding.SessionContext, ASYNC_METHODS);
  installRawMethods(binding.SessionContext);
});

/** The default binding (lib/loader.js: LLAMA_BRANCH_BINARY, the source build, the platform package). */
module.exports = loadBinary();
