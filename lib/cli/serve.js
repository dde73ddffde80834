'use strict';

/** `llama-branch serve`: the OpenAI-compatible server on a GGUF model, until SIGINT/SIGTERM. */

const { createServer } = require('../server');
const defaults = require('../defaults');

const { server: serverDefaults, scheduler: schedulerDefaults } = defaults;

const options = {
  model: { type: 'string', short: 'm', help: 'path of the .gguf model (required)' },
  port: { type: 'string', short: 'p', default: String(serverDefaults.port), help: 'TCP port; 0 picks a free one' },
  host: {
    type: 'string',
    default: serverDefaults.host,
    help: 'address to bind; 0.0.0.0 exposes the server to the network',
  },
  parallel: { type: 'string', default: String(serverDefaults.parallel), help: 'requests generating at once' },
  'ctx-size': {
    type: 'string',
    default: String(serverDefaults.nCtx),
    help: 'KV cells of the context (all requests and cached prefixes)',
  },
  'n-seq-max': {
    type: 'string',
    help: `sequence leases (default parallel × ${serverDefaults.leasesPerRequest} + ${serverDefaults.cacheLeases}, at most ${serverDefaults.maxSeqMax})`,
  },
  threads: { type: 'string', help: 'CPU threads per decode (default: all cores)' },
  'model-name': { type: 'string', help: 'model id in /v1/models (default: the file name)' },
  'prefill-chunk': {
    type: 'string',
    default: String(schedulerDefaults.prefillChunk),
    help: 'prompt tokens prefilled per scheduler step',
  },
  'max-queue': {
    type: 'string',
    default: String(schedulerDefaults.maxQueue),
    help: 'requests that may wait; more get HTTP 429',
  },
};

function integer(values, name) {
  const raw = values[name];
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new UsageError(`--${name} must be a non-negative integer, got ${raw}`);
  return n;
}

class UsageError extends Error {}

async function run(values, { log }) {
  if (!values.model) throw new UsageError('--model <file.gguf> is required');
  const server = await createServer({
    modelPath: values.model,
    modelName: values['model-name'],
    parallel: integer(values, 'parallel'),
    nCtx: integer(values, 'ctx-size'),
    nSeqMax: integer(values, 'n-seq-max'),
    nThreads: integer(values, 'threads'),
    scheduler: { prefillChunk: integer(values, 'prefill-chunk'), maxQueue: integer(values, 'max-queue') },
  });
  const { url } = await server.listen(integer(values, 'port'), values.host);
  log(`listening on ${url}`);
  await new Promise((resolve) => {
    const stop = () => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
  await server.close();
}

module.exports = {
  summary: 'OpenAI-compatible HTTP server (continuous batching, prefix cache)',
  usage: `llama-branch serve --model <file.gguf> [--port ${serverDefaults.port}] [--host ${serverDefaults.host}] [--parallel ${serverDefaults.parallel}]`,
  options,
  run,
  UsageError,
};
