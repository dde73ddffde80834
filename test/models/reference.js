'use strict';

// llama.cpp's own server as the independent reference for the real-model tier: the pinned
// `xllamacpp` wheel (llama.cpp's server compiled as a Python module; scripts/python.js installs it).

const { spawnSync } = require('node:child_process');
const { xllamacpp } = require('../../scripts/python');

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
