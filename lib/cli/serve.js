'use strict';

/** `llama-branch serve`: the OpenAI-compatible server on a GGUF model, until SIGINT/SIGTERM. */

const fs = require('node:fs');
const { createServer } = require('../index');
const defaults = require('../defaults');

const { server: serverDefaults, scheduler: schedulerDefaults } = defaults;

const options = {
  model: { type: 'string', short: 'm', help: 'path of the .gguf model (required)' },
  mmproj: {
    type: 'string',
    help: "path of the model's image projector (mmproj .gguf): chat messages may then hold image_url parts as data URLs",
  },
  'image-max-bytes': {
    type: 'string',
    help: 'with --mmproj: largest image file a request may send, in bytes (default 20 MiB); larger is a 400 image_too_large',
  },
  'image-max-pixels': {
    type: 'string',
    help: 'with --mmproj: most pixels (width × height) an image may have (default 16777216, 4096 × 4096)',
  },
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
  gpu: {
    type: 'string',
    default: 'auto',
    help: 'where the model runs: auto (the GPU when one works, else the CPU), vulkan (fail unless a Vulkan device works) or cpu',
  },
  'n-gpu-layers': {
    type: 'string',
    help: 'layers on the GPU, counting the output layer (default: all; 0 keeps the weights on the CPU)',
  },
  'cache-type-k': {
    type: 'string',
    default: 'f16',
    help: 'element type of the KV cache keys: f16, q8_0 (about half the memory) or q4_0 (about a quarter)',
  },
  'cache-type-v': {
    type: 'string',
    default: 'f16',
    help: 'element type of the KV cache values: f16, q8_0 or q4_0 (quantized needs flash attention)',
  },
  'flash-attn': {
    type: 'string',
    default: 'auto',
    help: 'flash attention: auto (where the backend has it), on or off',
  },
  deterministic: {
    type: 'boolean',
    help: 'bitwise-reproducible logits whatever the load, batch or cache (slower; docs/determinism.md)',
  },
  'model-name': { type: 'string', help: 'model id in /v1/models (default: the file name)' },
  'prefill-chunk': {
    type: 'string',
    default: String(schedulerDefaults.prefillChunk),
    help: 'prompt tokens prefilled per scheduler step',
  },
  'step-budget-ms': {
    type: 'string',
    help: "a decode step's time budget: extra branches (n choices, program forks) are admitted only while the predicted step stays within it, so streaming clients keep their token rate (default: none)",
  },
  'max-queue': {
    type: 'string',
    default: String(schedulerDefaults.maxQueue),
    help: 'requests that may wait; more get HTTP 429',
  },
  'cache-ram': {
    type: 'string',
    help: 'host RAM for the states of prefixes evicted from the KV cells, e.g. 2GiB (default: none)',
  },
  'cache-dir': {
    type: 'string',
    help: 'folder for prefix states leaving RAM, kept across restarts and shareable by servers of the same model and settings',
  },
  'cache-disk': {
    type: 'string',
    help: `disk the --cache-dir folder may take (default ${schedulerDefaults.cacheDisk})`,
  },
  'api-key': {
    type: 'string',
    multiple: true,
    help: 'require Authorization: Bearer KEY on /v1/* and /metrics (repeatable; also LLAMA_BRANCH_API_KEY, comma-separated)',
  },
  cors: { type: 'string', help: 'allow browser requests from this origin (e.g. https://app.example or *)' },
  embeddings: { type: 'boolean', help: 'serve POST /v1/embeddings from a second, pooled context on the same model' },
  'chat-template-file': {
    type: 'string',
    help: "a Jinja chat template to use instead of the model's (e.g. one with a thinking section)",
  },
  'reasoning-format': {
    type: 'string',
    default: serverDefaults.reasoningFormat,
    help: 'split chat replies into reasoning_content and content: none, auto, deepseek, deepseek-legacy',
  },
  spec: {
    type: 'string',
    default: 'none',
    help: 'speculative decoding: lookup (n-grams of the prompt, no second model), draft (needs --model-draft) or none',
  },
  'model-draft': { type: 'string', help: 'path of a smaller .gguf with the same vocabulary, for --spec draft' },
  'spec-max-draft': {
    type: 'string',
    default: String(serverDefaults.specMaxDraft),
    help: 'longest draft one request verifies per step (1..32; the length used adapts)',
  },
  'no-warmup': {
    type: 'boolean',
    help: 'on a GPU, do not compile the pipelines of every batch size at start (the first request of each size then stalls)',
  },
  'parse-special': {
    type: 'boolean',
    help: "parse clients' text that spells the model's special tokens (<start_of_turn>, <|im_start|>, ...) as those control tokens; by default it is plain text",
  },
  'no-ui': { type: 'boolean', help: 'do not serve the live page of the branch trees at / (GET /v1/events stays)' },
  'kv-events': {
    type: 'string',
    help: 'publish the prefix cache as KV events (vLLM format, ZeroMQ PUB, topic kv@<pod>@<model>) on tcp://HOST:PORT, for KV-aware routers',
  },
  'kv-events-format': {
    type: 'string',
    default: 'map',
    help: "the KV events' encoding: map (what current vLLM sends: maps tagged by type, with group_idx, kv_cache_spec_kind, extra_keys for images) or array (vLLM's earlier positional arrays)",
  },
  'grpc-port': {
    type: 'string',
    help: "also serve SMG's gRPC engine protocol (vllm.grpc.engine.VllmEngine: generation, KV events, the tokenizer) on this port of --host, for exact cache-aware routing by `smg launch --worker-urls grpc://HOST:PORT`",
  },
  trace: {
    type: 'string',
    help: 'record every scheduler event to this JSONL file (open it in the page to replay the run)',
  },
  'max-tokens-limit': {
    type: 'string',
    default: String(serverDefaults.maxTokensLimit),
    help: 'largest max_tokens a request may ask for',
  },
  'max-questions': {
    type: 'string',
    default: String(serverDefaults.maxQuestions),
    help: 'most questions one POST /v1/systemone request may ask',
  },
};

function integer(values, name) {
  const raw = values[name];
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new UsageError(`--${name} must be a non-negative integer, got ${raw}`);
  return n;
}

/** Where the server's side outputs go: the trace file, KV events, the gRPC worker. */
function sideLines(server, values) {
  return [
    ...(values.trace ? [`recording events to ${values.trace}`] : []),
    ...(server.kvEvents ? [`KV events on ${server.kvEvents.address} (topic ${server.kvEvents.topic})`] : []),
    ...(server.grpc ? [`gRPC worker (SMG's vLLM engine service) on ${server.grpc.address}`] : []),
  ];
}

class UsageError extends Error {}

/** --step-budget-ms as the Scheduler's `stepBudgetMs` (absent: no budget). */
function stepBudget(values) {
  const raw = values['step-budget-ms'];
  if (raw === undefined) return {};
  const ms = Number(raw);
  if (!(ms > 0 && Number.isFinite(ms))) throw new UsageError(`--step-budget-ms must be a positive number, got ${raw}`);
  return { stepBudgetMs: ms };
}

const GPU_CHOICES = ['auto', 'vulkan', 'cpu'];

/** --gpu and --n-gpu-layers as createContext's `gpu` and `nGpuLayers`, checked against each other. */
function placement(values) {
  const gpu = values.gpu === undefined ? 'auto' : values.gpu;
  if (!GPU_CHOICES.includes(gpu))
    throw new UsageError(`--gpu must be one of ${GPU_CHOICES.join(', ')}, got ${JSON.stringify(gpu)}`);
  const nGpuLayers = integer(values, 'n-gpu-layers');
  // With --gpu cpu no layer is offloaded whatever --n-gpu-layers says; a positive count there is
  // a contradiction the user should hear about rather than have silently ignored.
  if (gpu === 'cpu' && nGpuLayers !== undefined && nGpuLayers > 0)
    throw new UsageError(`--n-gpu-layers ${nGpuLayers} needs a GPU, but --gpu cpu keeps every layer on the CPU`);
  return { gpu, nGpuLayers };
}

const KV_TYPES = ['f16', 'q8_0', 'q4_0'];
const FLASH_ATTN = ['auto', 'on', 'off'];

/**
 * --cache-type-k/-v, --flash-attn and --deterministic as createContext's `typeK`, `typeV`,
 * `flashAttention` and `deterministic`.
 */
function kvCache(values) {
  const pick = (flag, choices, fallback) => {
    const v = values[flag] === undefined ? fallback : values[flag];
    if (!choices.includes(v))
      throw new UsageError(`--${flag} must be one of ${choices.join(', ')}, got ${JSON.stringify(v)}`);
    return v;
  };
  const typeK = pick('cache-type-k', KV_TYPES, 'f16');
  const typeV = pick('cache-type-v', KV_TYPES, 'f16');
  const flashAttention = pick('flash-attn', FLASH_ATTN, 'auto');
  // llama.cpp reads a quantized V cache only inside the flash-attention kernel (createContext
  // refuses the pair too; said here in the flags' own names).
  if (typeV !== 'f16' && flashAttention === 'off')
    throw new UsageError(
      `--cache-type-v ${typeV} needs flash attention: use --flash-attn auto or on, or --cache-type-v f16`,
    );
  // Deterministic contexts need flash attention (createContext's `deterministic`).
  if (values.deterministic && flashAttention === 'off')
    throw new UsageError('--deterministic needs flash attention: use --flash-attn auto or on');
  return { typeK, typeV, flashAttention, ...(values.deterministic ? { deterministic: true } : {}) };
}

/** --cache-ram, --cache-dir, --cache-disk as the Scheduler's options; its warnings go to the log. */
function cacheTiers(values, log) {
  const o = {};
  if (values['cache-ram'] !== undefined) o.cacheRam = values['cache-ram'];
  if (values['cache-dir'] !== undefined) o.cacheDir = values['cache-dir'];
  if (values['cache-disk'] !== undefined) o.cacheDisk = values['cache-disk'];
  if (o.cacheRam === undefined && o.cacheDir === undefined) return o;
  o.onCacheWarning = (message) => log(`warning: ${message}`);
  return o;
}

/** --mmproj, --image-max-bytes and --image-max-pixels as createContext's options (limits need a projector). */
function images(values) {
  const imageMaxBytes = integer(values, 'image-max-bytes');
  const imageMaxPixels = integer(values, 'image-max-pixels');
  if (values.mmproj === undefined) {
    const limit =
      imageMaxBytes !== undefined ? 'image-max-bytes' : imageMaxPixels !== undefined ? 'image-max-pixels' : null;
    if (limit) throw new UsageError(`--${limit} limits the images of --mmproj; give --mmproj FILE too`);
    return {};
  }
  for (const [flag, v] of [
    ['image-max-bytes', imageMaxBytes],
    ['image-max-pixels', imageMaxPixels],
  ])
    if (v === 0) throw new UsageError(`--${flag} must be a positive integer, got 0`);
  return {
    mmprojPath: values.mmproj,
    ...(imageMaxBytes === undefined ? {} : { imageMaxBytes }),
    ...(imageMaxPixels === undefined ? {} : { imageMaxPixels }),
  };
}

/** --api-key values and LLAMA_BRANCH_API_KEY's comma-separated keys together (undefined: none). */
function apiKeys(values) {
  const fromEnv = (process.env.LLAMA_BRANCH_API_KEY || '').split(',').map((k) => k.trim());
  const keys = [...(values['api-key'] || []), ...fromEnv].filter((k) => k !== '');
  return keys.length > 0 ? keys : undefined;
}

/** The text of --chat-template-file (undefined: the model's own template). */
function chatTemplate(values) {
  const file = values['chat-template-file'];
  if (file === undefined) return undefined;
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new UsageError(`--chat-template-file ${file}: ${e.message}`);
  }
}

async function run(values, { log }) {
  if (!values.model) throw new UsageError('--model <file.gguf> is required');
  const { gpu, nGpuLayers } = placement(values);
  const server = await createServer({
    modelPath: values.model,
    ...images(values),
    gpu,
    nGpuLayers,
    ...kvCache(values),
    modelName: values['model-name'],
    parallel: integer(values, 'parallel'),
    nCtx: integer(values, 'ctx-size'),
    nSeqMax: integer(values, 'n-seq-max'),
    nThreads: integer(values, 'threads'),
    scheduler: {
      prefillChunk: integer(values, 'prefill-chunk'),
      maxQueue: integer(values, 'max-queue'),
      ...stepBudget(values),
      ...cacheTiers(values, log),
      ...(values['parse-special'] ? { parseSpecial: true } : {}),
    },
    apiKeys: apiKeys(values),
    cors: values.cors,
    embeddings: Boolean(values.embeddings),
    reasoningFormat: values['reasoning-format'],
    chatTemplate: chatTemplate(values),
    maxTokensLimit: integer(values, 'max-tokens-limit'),
    maxQuestions: integer(values, 'max-questions'),
    speculative: values.spec,
    modelDraft: values['model-draft'],
    specMaxDraft: integer(values, 'spec-max-draft'),
    ui: !values['no-ui'],
    ...(values['no-warmup'] ? { warmup: false } : {}),
    traceFile: values.trace,
    ...(values['kv-events'] ? { kvEvents: values['kv-events'], kvEventsFormat: values['kv-events-format'] } : {}),
    ...(values['grpc-port'] ? { grpcPort: integer(values, 'grpc-port'), grpcHost: values.host } : {}),
  }).catch((e) => {
    // createContext's ERR_DEVICE speaks of its options (`gpu`, `nGpuLayers`); on the command
    // line the flag is what the user typed, so name it.
    if (e.code === 'ERR_DEVICE' && /nGpuLayers/.test(e.message)) e.message = `--n-gpu-layers: ${e.message}`;
    else if (e.code === 'ERR_DEVICE') e.message = `--gpu ${gpu}: ${e.message}`;
    throw e;
  });
  const { url } = await server.listen(integer(values, 'port'), values.host);
  log(`listening on ${url}`);
  if (!values['no-ui']) log(`branch trees live at ${url}/`);
  for (const line of sideLines(server, values)) log(line);
  if (server.ctx.warmup.state === 'warming') {
    log(
      `warming up: compiling the GPU pipelines of ${server.ctx.warmup.total} batch sizes (/health says 503 until done)`,
    );
    server.ctx.ready.then((w) =>
      log(`warm-up ${w.state} in ${(w.ms / 1000).toFixed(1)} s${w.error ? `: ${w.error}` : ''}`),
    );
  }
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
