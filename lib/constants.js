'use strict';

/**
 * llama.cpp's enums as the package exports them (`llama_pooling_type`, `common_reasoning_format`,
 * and the chat formats `formatChat` reports, read from the addon).
 */

const native = require('./native');

const PoolingType = Object.freeze({ UNSPECIFIED: -1, NONE: 0, MEAN: 1, CLS: 2, LAST: 3, RANK: 4 });
const ReasoningFormat = Object.freeze({ NONE: 0, AUTO: 1, DEEPSEEK_LEGACY: 2, DEEPSEEK: 3 });

/** "peg-simple" → "PEG_SIMPLE": llama.cpp's chat format names as constant names. */
function constantName(name) {
  return name.toUpperCase().replace(/[^A-Z0-9]+/g, '_');
}

/**
 * llama.cpp's chat formats by name: the numbers `formatChat` reports as `format`; the last,
 * `GENERIC`, is the shim's own JSON tool-call format.
 */
const ChatFormat = Object.freeze(
  Object.fromEntries(native._chatFormatNames().map((name, i) => [constantName(name), i])),
);

module.exports = { PoolingType, ReasoningFormat, ChatFormat };
