'use strict';

/**
 * Small helpers shared by the examples: command-line flags, model lookup, the two output modes
 * (human text vs `--jsonl` events) and a little log-probability math. Nothing here is part of
 * the library's API; copy what you need.
 *
 * Every example accepts:
 *   --model <path>   a GGUF file (default: $LLAMA_TEST_MODEL, else the default model in models/)
 *   --jsonl          machine mode: one JSON object per line on stdout, `{"event": ..., ...}`
 *   --threads <n>    CPU threads for decoding (default: all cores)
 *   --help
 * plus its own flags, written `--name value` or `--name=value`.
 */

const fs = require('node:fs');
const path = require('node:path');

const DEFAULT_MODEL = path.join(
  process.env.LLAMA_MODEL_DIR ? path.resolve(process.env.LLAMA_MODEL_DIR) : path.join(__dirname, '..', 'models'),
  'gemma-3-270m-q4_k_m.gguf',
);

/**
 * Parses `process.argv` against `defaults` (flag name → default value; the default's type
 * decides how the value is read). Unknown flags are an error, so typos do not go unnoticed.
 */
function parseFlags(usage, defaults) {
  const all = { model: '', jsonl: false, threads: 0, help: false, ...defaults };
  const flags = { ...all };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith('--')) {
      if (!flags.model) flags.model = arg; // a bare path is the model
      continue;
    }
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq === -1 ? undefined : eq).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(name in all)) fail(`unknown flag ${arg}\n\n${usage}`);
    if (typeof all[name] === 'boolean') {
      flags[name] = eq === -1 ? true : arg.slice(eq + 1) !== 'false';
      continue;
    }
    const value = eq === -1 ? argv[++i] : arg.slice(eq + 1);
    if (value === undefined) fail(`flag --${name} needs a value\n\n${usage}`);
    if (typeof all[name] === 'number') {
      const n = Number(value);
      if (!Number.isFinite(n)) fail(`flag --${name} needs a number, got ${JSON.stringify(value)}`);
      flags[name] = n;
    } else {
      flags[name] = value;
    }
  }
  if (flags.help) {
    console.log(usage);
    process.exit(0);
  }
  flags.model = resolveModel(flags.model);
  return flags;
}

function resolveModel(fromFlag) {
  const model = path.resolve(fromFlag || process.env.LLAMA_TEST_MODEL || DEFAULT_MODEL);
  if (!fs.existsSync(model)) {
    fail(
      `model not found: ${model}\nRun \`npm run fetch-model\` to download the default model, or pass --model /path/to/model.gguf.`,
    );
  }
  return model;
}

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(2);
}

/** Context options the examples share: the model, threads from `--threads`. */
function contextOptions(flags, options) {
  return { modelPath: flags.model, ...(flags.threads > 0 ? { nThreads: flags.threads } : {}), ...options };
}

/**
 * Output for one run. In human mode `say` prints and `emit` is silent; with `--jsonl` it is the
 * other way round (so stdout is pure JSON lines). `progress` draws a status line on stderr in
 * human mode only.
 */
function output(flags) {
  const jsonl = flags.jsonl;
  let progressShown = false;
  const clearProgress = () => {
    if (progressShown && process.stderr.isTTY) process.stderr.write('\r\x1b[K');
    progressShown = false;
  };
  return {
    jsonl,
    say(...parts) {
      if (jsonl) return;
      clearProgress();
      console.log(...parts);
    },
    write(text) {
      if (!jsonl) process.stdout.write(text);
    },
    emit(event, data = {}) {
      if (jsonl) process.stdout.write(`${JSON.stringify({ event, ...data })}\n`);
    },
    /**
     * With `--jsonl`, also writes the branch tree's events (docs/events.md) of `target` — a
     * context (`ctx.trace`) or a Scheduler (`subscribe`) — so `llama-branch serve`'s page can
     * replay the run. Returns the context's trace (its `finish(branch, reason)` marks results),
     * or null.
     */
    trace(target) {
      if (!jsonl) return null;
      const write = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
      if (typeof target.subscribe === 'function') {
        write({ event: 'hello', v: 1, source: 'script', t: Date.now() });
        target.subscribe(write);
        return null;
      }
      return target.trace(write);
    },
    /** `label [#####.....] done/total` on stderr (redrawn in place on a terminal). */
    progress(label, done, total) {
      if (jsonl) return;
      const width = 20;
      const filled = Math.round((width * done) / Math.max(total, 1));
      const line = `${label} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total}`;
      if (process.stderr.isTTY) {
        process.stderr.write(`\r\x1b[K${line}`);
        progressShown = true;
        if (done >= total) clearProgress();
      } else if (done === total || done % Math.max(1, Math.ceil(total / 4)) === 0) {
        process.stderr.write(`${line}\n`);
      }
    },
  };
}

/** Runs `main`, printing `code: message` and exiting 1 on failure. */
function run(main) {
  main().then(
    () => {
      process.exitCode = process.exitCode || 0;
    },
    (e) => {
      console.error(e && e.code ? `${e.code}: ${e.message}` : e);
      process.exit(1);
    },
  );
}

/** log(sum(exp(logits))), computed stably. */
function logSumExp(logits) {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  return max + Math.log(sum);
}

/** The `k` most likely tokens of a logits row with their log-probabilities, best first. */
function topLogProbs(logits, k) {
  const best = []; // kept sorted, descending by logit
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (best.length === k && v <= best[k - 1].logit) continue;
    let j = Math.min(best.length, k - 1);
    while (j > 0 && best[j - 1].logit < v) j--;
    best.splice(j, 0, { token: i, logit: v });
    if (best.length > k) best.pop();
  }
  const lse = logSumExp(logits);
  return best.map(({ token, logit }) => ({ token, logProb: logit - lse }));
}

/** log p(token) under a logits row. */
function logProb(logits, token) {
  return logits[token] - logSumExp(logits);
}

/** Text safe to print on one line. */
const oneLine = (s) => JSON.stringify(s);

const round = (x, digits = 3) => (Number.isFinite(x) ? Number(x.toFixed(digits)) : x);

module.exports = {
  parseFlags,
  contextOptions,
  output,
  run,
  logSumExp,
  topLogProbs,
  logProb,
  oneLine,
  round,
};
