// Type definitions for llama-branch.
//
// The package is CommonJS (`require('llama-branch')`); these declarations describe exactly what
// `lib/index.js` exports. Everything here is public API; members whose names start with `_` on
// the runtime objects are private plumbing between lib/ and the native addon and are not typed.
//
// Conventions used throughout:
// - Token ids, positions, sequence ids and branch handles are plain JavaScript numbers (integers).
// - Every error thrown or rejected by this package is an `Error` with a stable `code`
//   (see {@link ErrorCode} and {@link LlamaBranchError}).
// - Operations on one context run in call order. A synchronous method that touches the context's
//   state waits for the asynchronous operations queued before it (decode, prefill, commit, ...),
//   blocking the event loop meanwhile, then runs: `b.commit(t); b.produce()` behaves as if
//   `commit` had been synchronous. `await` the operation instead to keep the event loop free.

/// <reference types="node" />

// -------------------------------------------------------------------------------------------------
// Errors

/**
 * Every `error.code` this package produces.
 *
 * | code | meaning |
 * |---|---|
 * | `ERR_INVALID_ARG` | a wrong argument type or value (also napi-rs conversion failures) |
 * | `ERR_CONTEXT_DISPOSED` | the context was disposed |
 * | `ERR_CONTEXT_BUSY` | a re-entrant call while the context's own state is borrowed (does not arise in ordinary use; sync calls wait for queued work) |
 * | `ERR_BRANCH_DISPOSED` | the branch was pruned, destroyed or released by `retainOnly` |
 * | `ERR_FOREIGN_BRANCH` | a branch of another context was passed to a `BranchStore` |
 * | `ERR_MODEL_NOT_FOUND` | `modelPath` does not name a file |
 * | `ERR_MODEL_LOAD` | the file is not a loadable GGUF model |
 * | `ERR_CONTEXT_CREATE` | llama.cpp could not create the context (e.g. out of memory) |
 * | `ERR_TOKEN_OUT_OF_RANGE` | a token id outside `[0, vocabSize)` |
 * | `ERR_NO_FREE_SEQUENCE` | all `nSeqMax` sequence leases are held by live branches |
 * | `ERR_KV_FULL` | the decode would pass `nCtx` (or llama.cpp found no KV slot) |
 * | `ERR_DECODE` | `llama_decode` failed |
 * | `ERR_ABORTED` | the operation's `AbortSignal` aborted it (see {@link OperationOptions}); `name` is `'AbortError'` |
 * | `ERR_NO_LOGITS` | sampling/logits (or embeddings) requested before any were computed |
 * | `ERR_GRAMMAR` | invalid GBNF grammar / JSON schema, or every candidate token is masked |
 * | `ERR_GRAMMAR_REJECTED` | the token is not allowed by the branch's grammar |
 * | `ERR_TOKENIZE` | tokenization failed |
 * | `ERR_STATE` | llama.cpp refused a state change (e.g. partial KV removal), or a saved KV state is corrupt, truncated or incompatible |
 * | `ERR_UNSUPPORTED` | the model or context lacks a feature (no EOS/EOT token, embeddings not enabled) |
 * | `ERR_INTERNAL` | a bug in llama-branch (please report it) |
 * | `ERR_CHAT_TEMPLATE` | the chat template failed to parse or render (the message has the template's own error) |
 * | `ERR_CHAT_PARSE` | `parseChatOutput`: the output does not match the chat format's parser |
 * | `ERR_RPC_UNREACHABLE` | an RPC server (`rpcServers`) does not accept connections, failed earlier in this process, or died while a model loaded onto it |
 * | `ERR_DEVICE` | a device placement option does not fit the devices or the model: unknown device name, `nGpuLayers` above the model's layers + 1, `tensorSplit` of the wrong length, `mainGpu` out of range |
 * | `ERR_CONTEXT_LOST` | an RPC server the context uses died: the context is unusable (its memory and a thread stay leaked until the process exits); create a new one |
 * | `ERR_NATIVE_LOAD` | no build of the native addon could be loaded, or it loaded no compute backend (thrown by `require`, `loadBinary`, and `createContext` with a `gpuVariant`) |
 * | `ERR_QUEUE_FULL` | {@link Scheduler.generate}: `maxQueue` requests are waiting already |
 * | `ERR_SCHEDULER_CLOSED` | {@link Scheduler.generate} after {@link Scheduler.close}, or a request still queued when it was called |
 */
export type ErrorCode =
  | 'ERR_INVALID_ARG'
  | 'ERR_CONTEXT_DISPOSED'
  | 'ERR_CONTEXT_BUSY'
  | 'ERR_BRANCH_DISPOSED'
  | 'ERR_FOREIGN_BRANCH'
  | 'ERR_MODEL_NOT_FOUND'
  | 'ERR_MODEL_LOAD'
  | 'ERR_CONTEXT_CREATE'
  | 'ERR_TOKEN_OUT_OF_RANGE'
  | 'ERR_NO_FREE_SEQUENCE'
  | 'ERR_KV_FULL'
  | 'ERR_DECODE'
  | 'ERR_ABORTED'
  | 'ERR_NO_LOGITS'
  | 'ERR_GRAMMAR'
  | 'ERR_GRAMMAR_REJECTED'
  | 'ERR_TOKENIZE'
  | 'ERR_STATE'
  | 'ERR_UNSUPPORTED'
  | 'ERR_INTERNAL'
  | 'ERR_CHAT_TEMPLATE'
  | 'ERR_CHAT_PARSE'
  | 'ERR_RPC_UNREACHABLE'
  | 'ERR_DEVICE'
  | 'ERR_CONTEXT_LOST'
  | 'ERR_NATIVE_LOAD'
  | 'ERR_QUEUE_FULL'
  | 'ERR_SCHEDULER_CLOSED';

/**
 * The shape of every error this package throws or rejects with. Narrow a caught value with
 * `(e as LlamaBranchError).code === 'ERR_KV_FULL'`.
 */
export interface LlamaBranchError extends Error {
  code: ErrorCode;
}

/**
 * Options of the long operations (`ctx.decode`, `prefill`, `commit`, `decodeAndCaptureOne`).
 *
 * `signal` cancels the operation: aborted before the call or while it waits in the context's
 * queue, the operation never starts; aborted while it runs, llama.cpp stops at its next graph
 * node (typically within a few ms to ~100 ms). Either way the promise rejects with
 * `ERR_ABORTED` (`name === 'AbortError'`, `cause` = the signal's `reason`), every branch and
 * sequence is exactly as before the call (all chunks of a multi-chunk prefill are rolled back),
 * and later operations run normally. An abort after the operation settled has no effect.
 */
export interface OperationOptions {
  signal?: AbortSignal;
}

// -------------------------------------------------------------------------------------------------
// Context

/** llama.cpp log verbosity. The threshold is process-wide (it is not per context). */
export type LogLevel = 'none' | 'error' | 'warn' | 'info' | 'debug';

/** Unit for entropy and surprisal: natural log (`'nats'`, the default) or log2 (`'bits'`). */
export type EntropyBase = 'nats' | 'bits';

/** llama.cpp pooling types for embedding contexts (`llama_pooling_type`). */
export declare const PoolingType: {
  readonly UNSPECIFIED: -1;
  readonly NONE: 0;
  readonly MEAN: 1;
  readonly CLS: 2;
  readonly LAST: 3;
  readonly RANK: 4;
};
/** One of the values of {@link PoolingType}. */
export type PoolingType = (typeof PoolingType)[keyof typeof PoolingType];

/** Options for {@link createContext}. */
export interface ContextOptions {
  /**
   * Path of a `.gguf` model file, or a `file:` URL. Contexts created on the same file (and the
   * same `useMmap`) share one loaded model.
   */
  modelPath: string | URL;
  /**
   * KV cache size in cells (tokens, summed over all sequences). Default 2048; range 16 to 2^24.
   * llama.cpp may round it up (read the effective value from `ctx.nCtx`).
   */
  nCtx?: number;
  /** Maximum tokens per `llama_decode` call. Default 512 (llama.cpp caps it at `nCtx`). */
  nBatch?: number;
  /** CPU threads used by decodes. Default: the number of available CPU cores. */
  nThreads?: number;
  /**
   * Number of KV sequences, i.e. how many branches can be alive at once (one lease each).
   * Default 1; range 1 to 256.
   */
  nSeqMax?: number;
  /**
   * Create an embedding context: enables {@link SessionContext.encode} and
   * {@link SessionContext.getEmbeddings}. Default false. Every token of a decode is an output
   * row in such a context, so plain generation is slower there.
   */
  embeddings?: boolean;
  /** Pooling type for embedding contexts. Default `PoolingType.MEAN` with embeddings, else `NONE`. */
  poolingType?: PoolingType;
  /** Memory-map the model file. Default true. */
  useMmap?: boolean;
  /** Sets the (process-wide) llama.cpp log level before loading. Default: silent (`'none'`), or `LLAMA_BRANCH_LOG`. */
  logLevel?: LogLevel;
  /**
   * Layers placed on the GPU / RPC devices, counted from the output end: 0 to the model's layers
   * + 1 (the output layer). Default: all of them when such a device takes part, else 0 (ignored
   * when there is none). More than the model has: `ERR_DEVICE` (before anything loads).
   */
  nGpuLayers?: number;
  /** Index (into the offload devices) of the device for `splitMode: 'none'` and row-split results. Default 0. */
  mainGpu?: number;
  /** How layers spread over several devices. Default `'layer'`. */
  splitMode?: 'none' | 'layer' | 'row';
  /**
   * Relative share of the offloaded layers per device, one number per offload device in order
   * (`ctx.offload.devices`), e.g. `[1, 3]`. Default: by free memory. A wrong length: `ERR_DEVICE`.
   */
  tensorSplit?: number[];
  /**
   * Names (from {@link listDevices}) of the GPU / RPC devices to place layers on, in order.
   * Default: every local GPU, then the `rpcServers`' devices. Unknown names and the CPU: `ERR_DEVICE`.
   */
  devices?: string[];
  /**
   * llama.cpp RPC servers (`"host:port"`, IPv4 or a host name; started with
   * `npx llama-branch rpc-server`) whose devices take layers. Each is parsed and probed before
   * use: malformed → `ERR_INVALID_ARG`, not answering → `ERR_RPC_UNREACHABLE`. If a server dies
   * later, contexts using it are lost (`ERR_CONTEXT_LOST`); see docs/gpu-and-rpc.md, "Multi-host (RPC)".
   */
  rpcServers?: string[];
}

/** A backend device, from {@link listDevices}. */
export interface DeviceDescription {
  /** The name `devices` takes, e.g. `'CPU'`, `'Vulkan0'`, `'RPC0'`. */
  name: string;
  /** For an RPC device: its server's `host:port`. */
  description: string;
  type: 'cpu' | 'gpu' | 'rpc';
  /** Bytes (as the backend reports them; for the CPU and RPC CPU devices, the host's RAM). */
  memoryFree: number;
  memoryTotal: number;
}

export interface ListDevicesOptions {
  /** Also list the devices of these RPC servers (probed first; same errors as in {@link ContextOptions.rpcServers}). */
  rpcServers?: string[];
}

/**
 * The backend devices of this process (CPU, GPUs) and, with `rpcServers`, each server's.
 * Synchronous; with servers it waits for their answers (at most 15 s, then `ERR_RPC_UNREACHABLE`).
 */
export declare function listDevices(options?: ListDevicesOptions): DeviceDescription[];

export interface ServeRpcOptions {
  /** Address to bind. Default `'127.0.0.1'`; anything but loopback needs `allowRemote`. */
  host?: string;
  port: number;
  /** CPU threads for the server's computations. Default: all cores. */
  threads?: number;
  /** Folder where the server caches tensors by hash, so clients reload faster. */
  cacheDir?: string;
  /** Allow a non-loopback `host`. The RPC protocol has NO authentication or encryption. */
  allowRemote?: boolean;
}

export interface RpcServerInfo {
  endpoint: string;
  /** The local devices it serves (the GPUs, else the CPU). */
  devices: string[];
}

/**
 * Starts llama.cpp's RPC server on this process's devices, on a thread of its own. It serves
 * until the process exits (it cannot be stopped) and does not keep Node's event loop alive. One
 * client process at a time. Throws `ERR_INVALID_ARG` for a non-loopback host without
 * `allowRemote`, or a port it cannot bind.
 */
export declare function serveRpc(options: ServeRpcOptions): RpcServerInfo;

/** Where a context's layers went ({@link SessionContext.offload}). */
export interface OffloadInfo {
  /** Layers on GPU / RPC devices (the output layer counts as one, as in llama.cpp's log). */
  layers: number;
  /** The model's layers + 1. */
  totalLayers: number;
  /** The devices that took layers, in order (empty: CPU only). */
  devices: string[];
}

/**
 * Which build of the native addon to use. `'default'` (same as `'cpu'`): the normal resolution,
 * i.e. `LLAMA_BRANCH_BINARY`, else a local source build, else the prebuilt platform package
 * (whose CPU backend is chosen at run time for the CPU). `'cuda'` / `'vulkan'`: a source build
 * kept beside the CPU one in `build/<variant>/` (`LLAMA_BRANCH_FEATURES=vulkan npm run build --
 * --out build/vulkan`), else `build/` when it was built with that cargo feature, else the
 * platform package `llama-branch-<platform>-<variant>` (e.g. `llama-branch-linux-x64-gnu-vulkan`).
 * Source builds link llama.cpp statically, so a CPU and a GPU source build run side by side in
 * one process.
 */
export type GpuVariant = 'default' | 'cpu' | 'cuda' | 'vulkan';

/** The second argument of {@link createContext}. */
export interface LoadOptions {
  /** The build whose `createContext` is used. Default `'default'`. */
  gpuVariant?: GpuVariant;
}

/** A loaded build of the native addon, as {@link loadBinary} returns it. */
export interface NativeBinding {
  /** That build's llama.cpp system line (see {@link systemInfo}). */
  systemInfo(): string;
  /** The devices that build sees (see {@link listDevices}); e.g. a Vulkan build's GPUs. */
  listDevices(options?: ListDevicesOptions): DeviceDescription[];
  /** That build's context class; contexts it creates are `instanceof` this class. */
  readonly SessionContext: typeof SessionContext;
}

/**
 * Loads the model (shared between contexts on the same file) and creates a llama.cpp context,
 * off the main thread, with the build `loadOptions.gpuVariant` selects (see {@link loadBinary}).
 * Rejects with `ERR_MODEL_NOT_FOUND`, `ERR_MODEL_LOAD`, `ERR_CONTEXT_CREATE`, `ERR_INVALID_ARG`
 * (also for malformed `loadOptions` or an unknown variant), or `ERR_NATIVE_LOAD` when no build
 * of the requested variant loads.
 */
export declare function createContext(options: ContextOptions, loadOptions?: LoadOptions): Promise<SessionContext>;

/**
 * The native binding for `variant` (default: the one `require('llama-branch')` loaded), loaded
 * once per process and file. Throws `ERR_NATIVE_LOAD` when no build of that variant loads (the
 * message lists where it looked and how to get one), `ERR_INVALID_ARG` for an unknown variant.
 * Only one prebuilt (shared-library) build can be active in a process: load a GPU variant's
 * package in a process that has not loaded another prebuilt.
 */
export declare function loadBinary(variant?: GpuVariant): NativeBinding;

// SessionContext, Branch, BranchStore and Scheduler are declared from lib/'s JSDoc (types/, generated by
// scripts/lib-typings.js): each method is documented once, next to its code.
import { SessionContext } from './types/Context';
import { Branch } from './types/Branch';
import { BranchStore } from './types/BranchStore';
import { Scheduler } from './types/Scheduler';
export { SessionContext, Branch, BranchStore, Scheduler };

/**
 * llama.cpp's chat formats (`common_chat_format`) by name: the numbers
 * {@link SessionContext.formatChat} reports as `format` and `parseChatOutput` takes. Built at load
 * from the llama.cpp this package was compiled with; the list changes between llama.cpp
 * versions (the reference's `GENERIC` no longer exists).
 */
export declare const ChatFormat: {
  readonly CONTENT_ONLY: 0;
  readonly PEG_SIMPLE: 1;
  readonly PEG_NATIVE: 2;
  readonly PEG_GEMMA4: 3;
  readonly PEG_MINIMAX_M3: 4;
};
/** A chat format number (see the {@link ChatFormat} constants). */
export type ChatFormat = number;

/** Reasoning (thinking) extraction modes (llama.cpp's `common_reasoning_format`). */
export declare const ReasoningFormat: {
  readonly NONE: 0;
  readonly AUTO: 1;
  readonly DEEPSEEK_LEGACY: 2;
  readonly DEEPSEEK: 3;
};
/** One of the values of {@link ReasoningFormat}. */
export type ReasoningFormat = (typeof ReasoningFormat)[keyof typeof ReasoningFormat];
/** The names `formatChat` takes for {@link ReasoningFormat}. */
export type ReasoningFormatName = 'none' | 'auto' | 'deepseek' | 'deepseek_legacy';

/** Kinds of lazy-grammar triggers in {@link FormattedChatResult.grammarTriggers}. */
export declare const GrammarTriggerType: {
  readonly TOKEN: 0;
  readonly WORD: 1;
  readonly PATTERN: 2;
  readonly PATTERN_FULL: 3;
};
/** One of the values of {@link GrammarTriggerType}. */
export type GrammarTriggerType = (typeof GrammarTriggerType)[keyof typeof GrammarTriggerType];

/** A chat message in OpenAI's format (other fields, e.g. `tool_calls`, `tool_call_id`, are passed on). */
export interface ChatMessage {
  role: string;
  content?: string | ReadonlyArray<{ type: string; text?: string }> | null;
  [field: string]: unknown;
}

/** A tool in OpenAI's format. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: object };
}

/** Options of {@link SessionContext.formatChat}. */
export interface FormatChatOptions {
  /** A Jinja template to use instead of the model's. */
  templateOverride?: string;
  /** Tools the model may call (array or its JSON text). */
  tools?: string | readonly ChatTool[];
  /** Default `'auto'`. */
  toolChoice?: 'auto' | 'none' | 'required';
  /** Default false. */
  parallelToolCalls?: boolean;
  /** Default `'none'`. */
  reasoningFormat?: ReasoningFormatName;
  /** Default true (templates that support thinking open a thinking block). */
  enableThinking?: boolean;
  /** Constrain the answer to a JSON schema (object or JSON text); the grammar is in the result. */
  jsonSchema?: string | object;
  /** A GBNF grammar for the answer (not together with tools). */
  grammar?: string;
  /** Default true: end the prompt with the opening of the assistant's turn. */
  addGenerationPrompt?: boolean;
}

/** A lazy-grammar trigger: the grammar applies once this appears in the output. */
export interface GrammarTrigger {
  type: GrammarTriggerType;
  value: string;
  /** The token id for `TOKEN` triggers (-1 when the value is not one token). */
  token: number;
}

/** The result of {@link SessionContext.formatChat}. */
export interface FormattedChatResult {
  prompt: string;
  /** Extra stop strings of the template (beyond the model's end-of-generation tokens). */
  stopTokens: string[];
  format: ChatFormat;
  /** GBNF for tool calls or `jsonSchema` / `grammar`; `''` when unconstrained. */
  grammar: string;
  /** When true, install `grammar` lazily (`branch.setGrammar(grammar, {triggerWords, ...})`). */
  grammarLazy: boolean;
  /** The prompt ends inside an open thinking block. */
  thinkingForcedOpen: boolean;
  reasoningFormat: ReasoningFormat;
  /** Serialized output parser for {@link SessionContext.parseChatOutput}. */
  parser: string;
  /** The text that opens the assistant's turn (the parser matches it before the output). */
  generationPrompt: string;
  grammarTriggers: GrammarTrigger[];
  /** Tokens the grammar relies on staying whole. */
  preservedTokens: string[];
}

/** Options of {@link SessionContext.parseChatOutput}; a {@link FormattedChatResult} fits. */
export interface ParseChatOutputOptions {
  reasoningFormat?: ReasoningFormat | ReasoningFormatName;
  /** The output is unfinished (streaming): accept a truncated tool call. Default false. */
  isPartial?: boolean;
  /** Needs `generationPrompt` when a `parser` is given (the open block is part of it). */
  thinkingForcedOpen?: boolean;
  parser?: string;
  generationPrompt?: string;
}

/** A tool call found in the output. */
export interface ParsedToolCall {
  name: string;
  /** The arguments as JSON text. */
  arguments: string;
  id: string;
}

/** The result of {@link SessionContext.parseChatOutput}. */
export interface ParseChatOutputResult {
  content: string;
  reasoningContent: string;
  toolCalls: ParsedToolCall[];
}

/** What {@link SessionContext.kvCacheReadFile} resolves. */
export interface KvFileContents {
  /** The tokens stored with the state. */
  tokens: number[];
  /** Size of the file, in bytes. */
  bytesRead: number;
}

/**
 * Runs `fn` synchronously on the context's logits view ({@link SessionContext.getLogits}) and
 * returns its result. The view is revoked by the next decode, so the work must finish inside.
 * Throws `ERR_INVALID_ARG` if `fn` returns a promise (the callback must be synchronous).
 */
export declare function withLogits<T>(ctx: SessionContext, fn: (logits: Float32Array) => T): T;

/**
 * Converts a JSON schema (an object, or its JSON text) to a GBNF grammar with root rule `root`,
 * on the libuv thread pool (the event loop stays free). Rejects with `ERR_GRAMMAR` for text that
 * is not JSON or a schema llama.cpp cannot convert, `ERR_INVALID_ARG` for other argument types.
 */
export declare function jsonSchemaToGrammar(schema: string | object): Promise<string>;

/** {@link jsonSchemaToGrammar} on the calling thread; throws the same coded errors. */
export declare function jsonSchemaToGrammarSync(schema: string | object): string;

/** Sets the process-wide llama.cpp log level (same effect as `LLAMA_BRANCH_LOG`). */
export declare function setLogLevel(level: LogLevel): void;

/**
 * llama.cpp's system info line: the CPU features and backends in use. A prebuilt binary adds
 * `CPU_VARIANT = <name> | `: the CPU backend module ggml chose at load time for this CPU
 * (e.g. `haswell`, `icelake`, `zen4`); a source build has its CPU backend compiled in.
 */
export declare function systemInfo(): string;

// -------------------------------------------------------------------------------------------------
// Sampling

/** A static or dynamic logit bias. `bias` is added to the token's logit; `-Infinity` bans it. */
export interface TokenBias {
  token: number;
  bias: number;
}

/** Repetition penalties. Present (even `{}`) = enabled with these defaults. */
export interface PenaltyParams {
  /** Repeat penalty, > 0; 1 = off. Default 1. */
  repeat?: number;
  /** Frequency penalty. Default 0. */
  frequency?: number;
  /** Presence penalty. Default 0. */
  presence?: number;
  /** Window in tokens; -1 = the whole context. Default 64. */
  lastN?: number;
}

/** Mirostat sampling (replaces temperature/dist as the final stage). */
export interface MirostatParams {
  /** 0 = off, 1 = Mirostat, 2 = Mirostat 2.0. Default 2 when this object is present. */
  mode?: 0 | 1 | 2;
  /** Target surprise, > 0. Default 5. */
  tau?: number;
  /** Learning rate, > 0. Default 0.1. */
  eta?: number;
}

/** DRY ("don't repeat yourself") penalty. Enabled when `multiplier` > 0. */
export interface DryParams {
  /** >= 0; 0 = off. Default 0.8. */
  multiplier?: number;
  /** >= 1. Default 1.75. */
  base?: number;
  /** Default 2. */
  allowedLength?: number;
  /** -1 = the whole context. Default -1. */
  penaltyLastN?: number;
  /** Default `["\n", ":", "\"", "*"]`. */
  sequenceBreakers?: string[];
}

/** XTC ("exclude top choices"). Enabled when `probability` > 0. */
export interface XtcParams {
  /** In [0, 1]. Default 0.5. */
  probability?: number;
  /** In [0, 1]. Default 0.1. */
  threshold?: number;
}

/** Less common samplers. */
export interface AdvancedSamplingParams {
  /** Locally typical sampling, in (0, 1]; 1 = off. Default 1. */
  typicalP?: number;
  mirostat?: MirostatParams;
  dry?: DryParams;
  xtc?: XtcParams;
  /** Top-n-sigma, > 0. Default off. */
  topNSigma?: number;
}

/**
 * A branch's sampler chain. Invalid values are errors (`ERR_INVALID_ARG`), never silently clamped.
 *
 * Order: logit bias + steer → grammar → penalties → DRY → top-n-sigma → top-k → typical → top-p →
 * min-p → XTC → greedy | temperature + dist | temperature + mirostat.
 */
export interface SamplingParams {
  /** Default 0.8. `<= 0` = greedy (argmax), unless mirostat is enabled. */
  temperature?: number;
  /** Integer >= 0; 0 = off. Default 40. */
  topK?: number;
  /** In (0, 1]; 1 = off. Default 0.95. */
  topP?: number;
  /** In [0, 1]; 0 = off. Default 0.05. */
  minP?: number;
  /** RNG seed, integer in [0, 2^32). `-1` or absent = random. */
  seed?: number;
  /** GBNF grammar (root rule `root`) constraining the branch's tokens. */
  grammar?: string;
  /** Repetition penalties; off when absent. */
  penalties?: PenaltyParams;
  advanced?: AdvancedSamplingParams;
  /** Static per-token biases (kept by forks). */
  logitBias?: TokenBias[];
}

/** Lazy-grammar triggers for {@link Branch.setGrammar}: unconstrained until one appears. */
export interface LazyGrammarTriggers {
  /** Regexes over the generated text (the grammar applies from the first capture group). */
  triggerPatterns?: string[];
  /** Literal words; the grammar applies from the word on. */
  triggerWords?: string[];
  /** Token ids that trigger the grammar. */
  triggerTokens?: number[];
}

/** A sampled token, not yet committed. */
export interface Produced {
  token: number;
  /** The token's text piece. */
  text: string;
  /** True for end-of-generation tokens. */
  isStop: boolean;
}

/** One step of `for await (const { token, text } of branch)`. */
export interface BranchToken {
  token: number;
  text: string;
}

/** KV cache usage, counting cells shared by forks once. */
export interface KvPressure {
  /** Total KV cells of the context. */
  nCtx: number;
  /** Cells held by live branches and by unleased sequences with content. */
  cellsUsed: number;
  /** `nCtx - cellsUsed`. */
  remaining: number;
}

// -------------------------------------------------------------------------------------------------
// Branches

// -------------------------------------------------------------------------------------------------
// Serving: the Scheduler (continuous batching, prefix cache) and the OpenAI-compatible server

/** Why a choice ended: a stop string or end-of-generation token, `maxTokens`, or an abort. */
export type FinishReason = 'stop' | 'length' | 'abort';

/** Options of {@link Scheduler}. */
export interface SchedulerOptions {
  /**
   * Prompt tokens prefilled per step, over all newcomers together (FIFO). Default 256. Bounds
   * the extra latency a newcomer adds to every running request's step: one decode of at most
   * this many tokens (about 0.25 s for 256 tokens of the 270M test model on 2 cores).
   */
  prefillChunk?: number;
  /** Requests that may wait for room; one more rejects with `ERR_QUEUE_FULL`. Default 64. */
  maxQueue?: number;
  /** Requests admitted at once (the server's `--parallel`). Default: as many as leases and cells allow. */
  maxRunning?: number;
  /** `maxTokens` of requests that give none. Default 256. */
  defaultMaxTokens?: number;
  /** Called after every step (instrumentation, benchmarks). */
  onStep?: (info: SchedulerStepInfo) => void;
}

/** What one scheduler step did (see {@link SchedulerOptions.onStep}). */
export interface SchedulerStepInfo {
  /** Choices advanced by this step's one `store.commit` (its decode's rows). */
  rows: number;
  /** Prompt tokens prefilled in this step (at most `prefillChunk`). */
  prefillTokens: number;
  prefillMs: number;
  /** Time of the produce + commit for all running choices. */
  decodeMs: number;
  stepMs: number;
  /** KV cells in use after the step (shared prefixes counted once). */
  cellsUsed: number;
  running: number;
  queued: number;
}

/** A request for {@link Scheduler.generate}: exactly one of `prompt`, `tokens` or `messages`. */
export interface GenerateRequest {
  /** Text, tokenized with the model's BOS. */
  prompt?: string;
  /** Token ids, used as they are. */
  tokens?: number[];
  /** OpenAI-style messages, rendered with the model's chat template; leading system messages are cached as their own prefix. */
  messages?: ChatMessage[];
  /** Sampler of every choice (`seed` and `grammar` here work like the request's own). */
  params?: SamplingParams;
  /** Choices; the prompt is decoded once and forked `n` times. Default 1. */
  n?: number;
  /** New tokens per choice at most. Default `defaultMaxTokens` (256). */
  maxTokens?: number;
  /** Stop strings: the choice ends before the first one (it is not part of the text). */
  stop?: string | string[];
  /** GBNF grammar constraining every choice. */
  grammar?: string;
  /** A JSON schema (object or JSON text) constraining every choice (converted with {@link jsonSchemaToGrammar}). */
  jsonSchema?: object | string;
  /** Choice `i` samples with seed `(seed + i) mod 2^32`; absent or -1: a random base. */
  seed?: number;
  /** Aborting ends the request within one step: its choices finish with `'abort'`. */
  signal?: AbortSignal;
}

/**
 * One event of a generation. Every token produced gives `{choice, token, text}` (`text` may be
 * `''` while it could be the start of a stop string); each choice then ends with one event
 * whose `token` is null and whose `finishReason` is set (`text`: whatever was still held back).
 */
export interface GenerationEvent {
  choice: number;
  token: number | null;
  text: string;
  finishReason?: FinishReason;
}

/** One choice of a {@link GenerationResult}. */
export interface GenerationChoice {
  text: string;
  /** The generated tokens (an end-of-generation token is not included). */
  tokens: number[];
  finishReason: FinishReason;
  /** Model perplexity of the generated tokens; `Infinity` when there are none. */
  perplexity: number;
}

/** Token counts of a request. */
export interface GenerationUsage {
  promptTokens: number;
  /** Prompt tokens that came from the prefix cache instead of being prefilled. */
  cachedPromptTokens: number;
  completionTokens: number;
}

/** What a {@link Generation} resolves to. */
export interface GenerationResult {
  choices: GenerationChoice[];
  usage: GenerationUsage;
}

/**
 * What {@link Scheduler.generate} returns: awaitable for the {@link GenerationResult}, and an
 * async iterable of {@link GenerationEvent}s (from the first event, whenever iteration starts).
 * Errors reject the result and are thrown by the iterator.
 */
export interface Generation extends PromiseLike<GenerationResult>, AsyncIterable<GenerationEvent> {
  catch<T = never>(onRejected?: ((reason: unknown) => T | PromiseLike<T>) | null): Promise<GenerationResult | T>;
  finally(onFinally?: (() => void) | null): Promise<GenerationResult>;
}

/** What {@link Scheduler.stats} reports. */
export interface SchedulerStats {
  running: number;
  queued: number;
  /** Cached prompt prefixes (each holds one sequence lease). */
  cachedPrefixes: number;
  /** KV cells in use as of the last step. */
  cellsUsed: number;
  nCtx: number;
  /** `cachedPromptTokens / promptTokens` over all started requests. */
  hitRate: number;
  steps: number;
  promptTokens: number;
  cachedPromptTokens: number;
  prefilledTokens: number;
  generatedTokens: number;
  /** Cached prefixes evicted to make room. */
  evictions: number;
  /** Requests that finished (including aborted ones). */
  completed: number;
}

/** Options of {@link createServer}: `ctx` or `modelPath`. */
export interface ServerOptions {
  /** Serve on this context (the server does not dispose it). */
  ctx?: SessionContext;
  /** Or load this model (the server's context is disposed by {@link LlamaBranchServer.close}). */
  modelPath?: string;
  /** The model id of `/v1/models`; requests naming another model get 404. Default: the file name. */
  modelName?: string;
  /** Requests generating at once. Default 4. */
  parallel?: number;
  /** KV cells of a loaded context. Default 8192. */
  nCtx?: number;
  /** Sequences of a loaded context. Default `parallel` × 6 + 16 (n up to 4 per request plus cached prefixes). */
  nSeqMax?: number;
  /** Threads of a loaded context. Default: all cores. */
  nThreads?: number;
  /** Scheduler options (`maxRunning` defaults to `parallel`). */
  scheduler?: SchedulerOptions;
  /** Largest accepted request body, in bytes. Default 1 MiB. */
  maxBodyBytes?: number;
}

/** An OpenAI-compatible HTTP server over a {@link Scheduler}; see docs/serving.md. */
export interface LlamaBranchServer {
  readonly ctx: SessionContext;
  readonly scheduler: Scheduler;
  readonly modelName: string;
  /** The underlying node:http server. */
  readonly http: import('node:http').Server;
  /** Starts listening (default port 8080 on 127.0.0.1; port 0 = any free port). */
  listen(port?: number, host?: string): Promise<{ host: string; port: number; url: string }>;
  /** Stops listening, ends running requests, closes the scheduler (and disposes a loaded context). */
  close(): Promise<void>;
}

/**
 * Creates the OpenAI-compatible server (`POST /v1/completions`, `POST /v1/chat/completions`,
 * `GET /v1/models`, `GET /health`) on a context or a model file. Rejects like
 * {@link createContext} when loading fails, `ERR_INVALID_ARG` for bad options.
 */
export declare function createServer(options: ServerOptions): Promise<LlamaBranchServer>;
