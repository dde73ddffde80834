'use strict';

/** What the benchmark scripts share: their flags, the model they run on, and summary statistics. */

const net = require('node:net');
const path = require('node:path');
const { spawn } = require('node:child_process');

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

/** A TCP port free on 127.0.0.1 right now (for a server the bench starts). */
function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/**
 * Starts a server process and resolves `{ child, url }` once `url`/health answers 200 (`options`
 * go to spawn; stderr is kept for the error when it exits or never answers).
 */
async function startProcess(cmd, argv, port, options = {}) {
  const child = spawn(cmd, argv, { stdio: ['ignore', 'ignore', 'pipe'], ...options });
  let err = '';
  child.stderr.on('data', (d) => (err = (err + d).slice(-4000)));
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    if (child.exitCode !== null) throw new Error(`${cmd} exited: ${err}`);
    try {
      if ((await fetch(`${url}/health`)).status === 200) return { child, url };
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  child.kill('SIGKILL');
  throw new Error(`${cmd} did not answer /health: ${err}`);
}

/** Stops a process startProcess started and resolves once it exited. */
function stopProcess(child) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  return exited;
}

/** llama.cpp's server, run from the xllamacpp wheel: the settings come as JSON in argv[1]. */
const LLAMA_CPP_SERVER = `
import json, sys, time
import xllamacpp as xlc
cfg = json.loads(sys.argv[1])
p = xlc.CommonParams()
p.model.path = cfg['model']
p.n_ctx = cfg['nCtx']
p.n_parallel = cfg['parallel']
p.cpuparams.n_threads = cfg['threads']
p.cpuparams_batch.n_threads = cfg['threads']
p.embedding = cfg['embedding']
if cfg['draft']:
    p.speculative.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    p.speculative.draft.mparams.path = cfg['draft']
    p.speculative.draft.n_max = cfg['draftMax']
    p.speculative.draft.cpuparams.n_threads = cfg['threads']
    p.speculative.draft.cpuparams_batch.n_threads = cfg['threads']
p.hostnames = ['127.0.0.1']
p.port = cfg['port']
server = xlc.Server(p)
print('listening on', server.listening_address, flush=True)
while True:
    time.sleep(3600)
`;

/**
 * llama.cpp's own server (the pinned xllamacpp wheel, scripts/python.js) on 127.0.0.1 as
 * `startProcess` starts it. `embedding`: embedding mode; `draft`: a draft model's path for
 * llama.cpp's draft-model speculation (`draft_simple`, `draftMax` tokens, its default 3).
 * @param {{ model: string, port: number, threads: number, nCtx?: number, parallel?: number,
 *   embedding?: boolean, draft?: string | null, draftMax?: number }} config
 */
function startLlamaCppServer(config) {
  const { xllamacpp } = require('../scripts/python');
  const { python, env } = xllamacpp();
  const cfg = { nCtx: 4096, parallel: 1, embedding: false, draft: null, draftMax: 3, ...config };
  return startProcess(python, ['-c', LLAMA_CPP_SERVER, JSON.stringify(cfg)], cfg.port, { env });
}

/** A Markdown table: `head` the column titles, `rows` arrays of cells; a title ending in ':' is right-aligned. */
function markdownTable(head, rows) {
  const titles = head.map((h) => h.replace(/:$/, ''));
  const rule = head.map((h) => (h.endsWith(':') ? '---:' : '---'));
  return [titles, rule, ...rows.map((r) => r.map(String))].map((cells) => `| ${cells.join(' | ')} |`).join('\n');
}

/**
 * `text` with what lies between `<!-- name:start -->` and `<!-- name:end -->` replaced by `body`;
 * when the markers are missing, the section is appended under `heading`.
 */
function replaceSection(text, name, body, heading) {
  const start = `<!-- ${name}:start -->`;
  const end = `<!-- ${name}:end -->`;
  const block = `${start}\n${body.trim()}\n${end}`;
  const i = text.indexOf(start);
  const j = text.indexOf(end);
  if (i >= 0 && j > i) return text.slice(0, i) + block + text.slice(j + end.length);
  return `${text.replace(/\n*$/, '')}\n\n${heading}\n\n${block}\n`;
}

module.exports = {
  args,
  modelPath,
  median,
  percentile,
  freePort,
  startProcess,
  stopProcess,
  startLlamaCppServer,
  markdownTable,
  replaceSection,
};
