'use strict';

const { fileURLToPath } = require('node:url');
const native = require('./native');
const loader = require('./loader');
const { makeError, guardedView } = require('./errors');
const { Branch } = require('./Branch');
const { BranchStore } = require('./BranchStore');
const { SessionContext, MediaPrompt, wrapContext } = require('./Context');
const { checkWarmupOption } = require('./warmup');
const { jsonSchemaToGrammar, jsonSchemaToGrammarSync } = require('./schema');
const { PromptLookup, DraftModel } = require('./speculative');
const { Scheduler } = require('./Scheduler');
const { ProgramLine } = require('./ProgramLine');
const server = require('./server');
const { PoolingType, ReasoningFormat, ChatFormat } = require('./constants');
const { GrammarTriggerType } = require('./scheduler/chat');
const { readEntryFile, fingerprintOf } = require('./scheduler/cache-file');

const NUMBER_OPTIONS = ['nCtx', 'nBatch', 'nThreads', 'nSeqMax', 'nOutputs', 'poolingType', 'nGpuLayers', 'mainGpu'];

/** Public views of loaded bindings, by guarded binding (one per build). */
const publicBindings = new WeakMap();

/** Guarded views of loaded bindings, by native binding: one view per build. */
const guardedBindings = new WeakMap([[loader.loadBinary(), native]]);

/** The guarded binding of GPU `variant` (the default one for undefined). */
function guardedBinding(variant) {
  if (variant === undefined) return native;
  const binding = loader.loadBinary(variant);
  if (!guardedBindings.has(binding)) guardedBindings.set(binding, guardedView(binding));
  return guardedBindings.get(binding);
}

/**
 * A loaded build of the addon as users see it: `createContext(options)` on that build (the
 * reference's loader contract: a module is valid when it has `createContext`), its system line,
 * its devices and the context class (contexts of every build are `SessionContext`s of
 * lib/Context.js).
 */
function publicBinding(binding) {
  let view = publicBindings.get(binding);
  if (!view) {
    view = Object.freeze({
      createContext: (options) => createContextOn(binding, options),
      systemInfo: () => binding.systemInfo(),
      listDevices: (options) => listDevicesOf(binding, options),
      SessionContext,
    });
    publicBindings.set(binding, view);
  }
  return view;
}

/**
 * The binding for `variant` ('default' | 'cpu' | undefined: the normal resolution;
 * 'cuda' | 'vulkan': that GPU build). See lib/loader.js for where each is looked for.
 */
function loadBinary(variant) {
  return publicBinding(
    variant === undefined
      ? native
      : guardedBinding(loader.normalizeVariant(variant, 'loadBinary(variant)') || undefined),
  );
}

/** The guarded binding `loadOptions.gpuVariant` selects (the default binding without one). */
function bindingFor(loadOptions) {
  if (loadOptions === undefined || loadOptions === null) return native;
  const where = 'createContext(options, loadOptions)';
  if (typeof loadOptions !== 'object' || Array.isArray(loadOptions)) {
    throw makeError(
      'ERR_INVALID_ARG',
      `${where}: loadOptions must be an object such as { gpuVariant: 'vulkan' }, got ${Array.isArray(loadOptions) ? 'an array' : typeof loadOptions}`,
    );
  }
  const unknown = Object.keys(loadOptions).filter((k) => k !== 'gpuVariant');
  if (unknown.length)
    throw makeError(
      'ERR_INVALID_ARG',
      `${where}: unknown loadOptions ${unknown.join(', ')}; the only one is gpuVariant`,
    );
  const variant = loader.normalizeVariant(loadOptions.gpuVariant, `${where}: loadOptions.gpuVariant`);
  return guardedBinding(variant || undefined);
}

/**
 * Loads the model (shared between contexts on the same file) and creates a context, off the main
 * thread, with the binding `loadOptions.gpuVariant` selects.
 */
async function createContext(options, loadOptions) {
  return createContextOn(bindingFor(loadOptions), options);
}

/** `createContext` on one guarded binding: the options checked, the placement resolved, the facade made. */
async function createContextOn(binding, options) {
  if (options === null || typeof options !== 'object')
    throw makeError('ERR_INVALID_ARG', 'createContext(options): expected an options object');
  let modelPath = options.modelPath;
  if (modelPath instanceof URL || (typeof modelPath === 'string' && modelPath.startsWith('file://'))) {
    try {
      modelPath = fileURLToPath(modelPath);
    } catch (e) {
      throw makeError('ERR_INVALID_ARG', `options.modelPath is not a valid file URL: ${e.message}`);
    }
  }
  for (const k of NUMBER_OPTIONS) {
    if (options[k] !== undefined && typeof options[k] !== 'number')
      throw makeError('ERR_INVALID_ARG', `options.${k} must be a number, got ${typeof options[k]}`);
  }
  for (const k of ['embeddings', 'useMmap', 'deterministic']) {
    if (options[k] !== undefined && typeof options[k] !== 'boolean')
      throw makeError('ERR_INVALID_ARG', `options.${k} must be a boolean`);
  }
  if (options.logLevel !== undefined && typeof options.logLevel !== 'string')
    throw makeError('ERR_INVALID_ARG', 'options.logLevel must be a string');
  // The values are checked natively (with the choices in the message); a non-string would only
  // get napi-rs's generic conversion error there.
  for (const [k, choices] of [
    ['typeK', "'f16', 'q8_0' or 'q4_0'"],
    ['typeV', "'f16', 'q8_0' or 'q4_0'"],
    ['flashAttention', "'auto', 'on' or 'off'"],
  ]) {
    if (options[k] !== undefined && typeof options[k] !== 'string')
      throw makeError('ERR_INVALID_ARG', `options.${k} must be ${choices}, got ${typeof options[k]}`);
  }
  if (options.splitMode !== undefined && typeof options.splitMode !== 'string')
    throw makeError('ERR_INVALID_ARG', "options.splitMode must be 'none', 'layer' or 'row'");
  if (
    options.tensorSplit !== undefined &&
    !(Array.isArray(options.tensorSplit) && options.tensorSplit.every((v) => typeof v === 'number'))
  ) {
    throw makeError('ERR_INVALID_ARG', 'options.tensorSplit must be an array of numbers');
  }
  for (const k of ['devices', 'rpcServers']) {
    if (options[k] !== undefined && !(Array.isArray(options[k]) && options[k].every((v) => typeof v === 'string'))) {
      throw makeError('ERR_INVALID_ARG', `options.${k} must be an array of strings`);
    }
  }
  const warmup = checkWarmupOption(options.warmup);
  return wrapContext(await binding.createContext({ ...placementOf(options, binding), modelPath }), warmup);
}

/** Why this process has no Vulkan device: the module package's reason, or the build's. */
function noVulkanReason() {
  const status = loader.gpuModules().find((m) => m.variant === 'vulkan');
  if (status && status.error) return `${status.package}: ${loader.moduleReason(status)}`;
  return `this build has no Vulkan backend: install ${loader.platformPackageName('vulkan')} beside the prebuilt (npm install ${loader.platformPackageName('vulkan')}), or build from source with LLAMA_BRANCH_FEATURES=vulkan (docs/gpu-and-rpc.md)`;
}

let fallbackWarned = false;

/**
 * `gpu: 'auto'` with a GPU module package installed that did not load: the CPU serves, and the
 * process is told why once (a warning, never an error: `auto` means "the GPU when it works").
 */
function warnGpuFallback() {
  if (fallbackWarned) return;
  const off = loader.gpuModules().find((m) => m.error && m.error !== 'not installed' && !m.error.startsWith('skipped'));
  if (!off) return;
  fallbackWarned = true;
  process.emitWarning(
    `${off.package} is installed but off: ${loader.moduleReason(off)}. Running on the CPU (createContext({ gpu: false }) says so explicitly).`,
    {
      code: 'LLAMA_BRANCH_GPU_FALLBACK',
    },
  );
}

/**
 * The placement options `options.gpu` stands for: 'auto' (default: every GPU the build sees
 * takes all layers, else the CPU), 'vulkan' (the Vulkan devices, or ERR_DEVICE saying why there
 * is none) or false / 'cpu' (the CPU alone, even with a GPU present).
 */
function placementOf(options, binding) {
  const { gpu = 'auto', ...rest } = options;
  if (gpu === 'auto' || gpu === true) {
    warnGpuFallback();
    return rest;
  }
  if (gpu === false || gpu === 'cpu') {
    if ((rest.devices && rest.devices.length > 0) || (rest.rpcServers && rest.rpcServers.length > 0))
      throw makeError('ERR_INVALID_ARG', 'options.gpu is false (the CPU only) but devices or rpcServers name others');
    return { ...rest, devices: [] };
  }
  if (gpu === 'vulkan') {
    const vulkan = binding.listDevices().filter((d) => d.type === 'gpu' && /^vulkan/i.test(d.name));
    if (vulkan.length === 0)
      throw makeError('ERR_DEVICE', `options.gpu is 'vulkan' but no Vulkan device is available. ${noVulkanReason()}`);
    return rest.devices ? rest : { ...rest, devices: vulkan.map((d) => d.name) };
  }
  throw makeError(
    'ERR_INVALID_ARG',
    `options.gpu must be 'auto', 'vulkan', 'cpu' or false, got ${JSON.stringify(gpu)}`,
  );
}

/**
 * llama.cpp's system line, plus which GPU backend modules the prebuilt loaded (and why not).
 * @returns {string}
 */
function systemInfo() {
  const modules = loader
    .gpuModules()
    .map((m) =>
      m.loaded && m.devices > 0 ? `${m.variant}: ${m.devices} device(s)` : `${m.variant}: off (${m.error})`,
    );
  return modules.length > 0 ? `${native.systemInfo()}GPU_MODULES = ${modules.join('; ')} | ` : native.systemInfo();
}

/** Backend devices of this process and, with `rpcServers`, of each RPC server. */
function listDevices(options) {
  return listDevicesOf(native, options);
}

function listDevicesOf(binding, options) {
  if (options !== undefined && (options === null || typeof options !== 'object'))
    throw makeError('ERR_INVALID_ARG', 'listDevices(options): expected an options object');
  const rpcServers = options && options.rpcServers;
  if (rpcServers !== undefined && !(Array.isArray(rpcServers) && rpcServers.every((v) => typeof v === 'string'))) {
    throw makeError('ERR_INVALID_ARG', 'options.rpcServers must be an array of strings');
  }
  return binding.listDevices(rpcServers ? { rpcServers } : undefined);
}

/** Runs llama.cpp's RPC server in this process until it exits (see docs/gpu-and-rpc.md, "Multi-host (RPC)"). */
function serveRpc(options) {
  if (options === null || typeof options !== 'object')
    throw makeError('ERR_INVALID_ARG', 'serveRpc(options): expected an options object with a port');
  const { host, port, threads, cacheDir, allowRemote } = options;
  if (typeof port !== 'number') throw makeError('ERR_INVALID_ARG', 'options.port must be a number');
  if (threads !== undefined && typeof threads !== 'number')
    throw makeError('ERR_INVALID_ARG', 'options.threads must be a number');
  for (const [k, v] of [
    ['host', host],
    ['cacheDir', cacheDir],
  ]) {
    if (v !== undefined && typeof v !== 'string') throw makeError('ERR_INVALID_ARG', `options.${k} must be a string`);
  }
  if (allowRemote !== undefined && typeof allowRemote !== 'boolean')
    throw makeError('ERR_INVALID_ARG', 'options.allowRemote must be a boolean');
  return native.serveRpc({ host, port, threads, cacheDir, allowRemote });
}

/** Runs `fn(logits)` synchronously on the zero-copy view of the context's last logits row (see getLogits). */
function withLogits(ctx, fn) {
  const result = fn(ctx.getLogits());
  if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
    throw makeError(
      'ERR_INVALID_ARG',
      'withLogits callback must be synchronous: logits change with the next decode, so finish all work inside the callback',
    );
  }
  return result;
}

/**
 * Reads and checks one file of a Scheduler's `cacheDir` against `ctx`: resolves its tokens and
 * size, read and checked on `ctx`'s worker; rejects with ERR_STATE_CORRUPT (truncated, corrupted,
 * not such a file) or ERR_STATE_MISMATCH (a state from another model or KV settings, which `ctx`
 * must never load).
 * @param {SessionContext} ctx
 * @param {string} file
 * @returns {Promise<{ tokens: number[], images: { start: number, nPos: number, id: string }[], stateBytes: number }>}
 */
async function readPrefixCacheFile(ctx, file) {
  if (typeof file !== 'string' || file === '')
    throw makeError('ERR_INVALID_ARG', 'readPrefixCacheFile(ctx, file): file must be a path');
  const { tokens, images, state } = await readEntryFile(file, fingerprintOf(ctx));
  return { tokens, images, stateBytes: state.length };
}

module.exports = {
  createContext,
  loadBinary,
  Branch,
  BranchStore,
  Scheduler,
  ProgramLine,
  PromptLookup,
  DraftModel,
  /**
   * The OpenAI-compatible server (see ServerOptions in index.d.ts); contexts it opens come from
   * this package's createContext.
   * @param {any} options
   */
  createServer: (options) => server.createServer(options, createContext),
  withLogits,
  SessionContext,
  MediaPrompt,
  jsonSchemaToGrammar,
  jsonSchemaToGrammarSync,
  setLogLevel: native.setLogLevel,
  systemInfo,
  gpuModules: loader.gpuModules,
  listDevices,
  serveRpc,
  PoolingType,
  ChatFormat,
  ReasoningFormat,
  GrammarTriggerType,
  readPrefixCacheFile,
};
