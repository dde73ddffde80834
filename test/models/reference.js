'use strict';

// llama.cpp's own server as the independent reference for the real-model tier: the `xllamacpp`
// wheel (llama.cpp's server compiled as a Python module), pinned, installed once with
// `pip install --target` into ~/.cache/llama-branch/xllamacpp (no dependencies: it needs none).

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { testPython } = require('../../scripts/python');

const XLLAMACPP = 'xllamacpp==2026.10.11549';
const TARGET = path.join(os.homedir(), '.cache', 'llama-branch', 'xllamacpp');

/** The interpreter and PYTHONPATH that import xllamacpp, installing it on first use. */
function xllamacpp() {
  const python = testPython() || 'python3';
  if (!fs.existsSync(path.join(TARGET, 'xllamacpp'))) {
    const args = ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-deps', '--target', TARGET];
    const r = spawnSync(python, [...args, XLLAMACPP], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    if (r.status !== 0) throw new Error(`pip could not install ${XLLAMACPP} (the reference): ${r.stderr}`);
  }
  return { python, env: { ...process.env, PYTHONPATH: TARGET } };
}

const EMBED = `
import json, sys
import xllamacpp as xlc
cfg = json.loads(sys.stdin.read())
p = xlc.CommonParams()
p.model.path = cfg['model']
p.embedding = True
p.n_ctx = 2048
p.cpuparams.n_threads = 2
p.cpuparams_batch.n_threads = 2
server = xlc.Server(p)
out = server.handle_embeddings({'input': cfg['texts']})
print(json.dumps([d['embedding'] for d in sorted(out['data'], key=lambda d: d['index'])]))
`;

/** llama.cpp's embeddings of `texts` on `model` (pooling as the GGUF says, normalised). */
function referenceEmbeddings(model, texts) {
  const { python, env } = xllamacpp();
  const r = spawnSync(python, ['-c', EMBED], {
    input: JSON.stringify({ model, texts }),
    encoding: 'utf8',
    env,
    maxBuffer: 64 << 20,
  });
  if (r.status !== 0) throw new Error(`the xllamacpp reference failed (${r.status}): ${r.stderr.slice(-2000)}`);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

module.exports = { xllamacpp, referenceEmbeddings };
