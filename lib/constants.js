'use strict';

/** llama.cpp's enums as the package exports them (`llama_pooling_type`, `common_reasoning_format`). */

const PoolingType = Object.freeze({ UNSPECIFIED: -1, NONE: 0, MEAN: 1, CLS: 2, LAST: 3, RANK: 4 });
const ReasoningFormat = Object.freeze({ NONE: 0, AUTO: 1, DEEPSEEK_LEGACY: 2, DEEPSEEK: 3 });

module.exports = { PoolingType, ReasoningFormat };
