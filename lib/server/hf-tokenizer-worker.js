'use strict';

// A worker thread of the gRPC worker (./grpc.js): builds the model's Hugging Face tokenizer zip
// (./hf-tokenizer.js; seconds for a large vocabulary) off the server's event loop.

const { parentPort, workerData } = require('node:worker_threads');
const { hfTokenizerFiles, zipFiles } = require('./hf-tokenizer');

try {
  const { modelPath, chatTemplate, maxLength } = workerData;
  const zip = zipFiles(hfTokenizerFiles(modelPath, { chatTemplate, maxLength }));
  parentPort.postMessage({ zip }, [zip.buffer]);
} catch (e) {
  parentPort.postMessage({ error: { message: e.message, code: e.code } });
}
