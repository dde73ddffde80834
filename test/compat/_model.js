'use strict';

// The model the compatibility programs load: LLAMA_TEST_MODEL (npm test exports it) or the
// default download location.
const path = require('node:path');

module.exports = process.env.LLAMA_TEST_MODEL || path.join(__dirname, '..', '..', 'models', 'gemma-3-270m-q4_k_m.gguf');
