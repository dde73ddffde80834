'use strict';

/** What the benchmark scripts share: their flags, the model they run on, and summary statistics. */

const path = require('node:path');

/** `--name=value` / `--flag` arguments as an object (a bare flag is `true`). */
const args = Object.fromEntries(
  process.argv.slice(2).map((a) => {
    const [k, v] = a.replace(/^--/, '').split('=');
    return [k, v === undefined ? true : v];
  }),
);

/** LLAMA_TEST_MODEL, else the default model (fetched when missing). */
function modelPath() {
  if (process.env.LLAMA_TEST_MODEL) return path.resolve(process.env.LLAMA_TEST_MODEL);
  return require('../scripts/fetch-model').ensureModel();
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The nearest-rank percentile `p` (0..100) of `xs`. */
function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

module.exports = { args, modelPath, median, percentile };
