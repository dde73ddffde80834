// Type definitions for llama-branch.
//
// What is written by hand here, and why: the module functions of lib/index.js and the option and
// result shapes of the JavaScript layer (chat JSON from the C++ shim, the Scheduler's requests and
// results, branch programs, speculative decoding, trace events, the server). This file is their
// only declaration: lib/ names them through lib/types.d.ts. The classes come from lib/'s JSDoc
// (types/) and the addon's own shapes from Rust (lib/native.d.ts); both are generated.
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
 * | `ERR_BRANCH_PARKED` | the branch is parked (no sequence, no KV cells), or a parked child still needs its cells |
 * | `ERR_FOREIGN_BRANCH` | a branch of another context was passed to a `BranchStore` |
 * | `ERR_MODEL_NOT_FOUND` | `modelPath` does not name a file |
 * | `ERR_MODEL_LOAD` | the file is not a loadable GGUF model |
 * | `ERR_CONTEXT_CREATE` | llama.cpp could not create the context (e.g. out of memory) |
 * | `ERR_TOKEN_OUT_OF_RANGE` | a token id outside `[0, vocabSize)` |
 * | `ERR_NO_FREE_SEQUENCE` | all `nSeqMax` sequence leases are held by live branches, or {@link BranchStore.restoreTree} needs more free ones than there are |
 * | `ERR_KV_FULL` | the decode would pass `nCtx` (or llama.cpp found no KV slot) |
 * | `ERR_DECODE` | `llama_decode` failed |
 * | `ERR_ABORTED` | the operation's `AbortSignal` aborted it (see {@link OperationOptions}); `name` is `'AbortError'` |
 * | `ERR_NO_LOGITS` | sampling/logits (or embeddings) requested before any were computed |
 * | `ERR_GRAMMAR` | invalid GBNF grammar / JSON schema, or every candidate token is masked |
 * | `ERR_GRAMMAR_REJECTED` | the token is not allowed by the branch's grammar |
 * | `ERR_TOKENIZE` | tokenization failed |
 * | `ERR_STATE` | llama.cpp refused a state change (e.g. partial KV removal), or a raw KV state (`kvCacheLoad`, `kvCacheReadFile`) is corrupt, truncated or incompatible |
 * | `ERR_STATE_MISMATCH` | a saved-state file (a branch tree, a prefix-cache file) comes from another model, llama.cpp state format or KV configuration (`typeK`, `typeV`, flash attention) |
 * | `ERR_STATE_CORRUPT` | a saved-state file (a branch tree, a prefix-cache file) is truncated, fails its checksum, is not such a file or holds values this context refuses |
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
 * | `ERR_TOO_MANY_BRANCHES` | {@link ProgramLine.fork} or {@link ProgramLine.resume} past the program's `maxBranches` |
 * | `ERR_PROGRAM_STATE` | a program line used while a gen runs on it, while parked, after `release()`, or after its program ended |
 * | `ERR_VOCAB_MISMATCH` | a {@link DraftModel}'s vocabulary differs from the target model's |
 * | `ERR_TOKENIZER_UNSUPPORTED` | the gRPC worker cannot write a Hugging Face tokenizer for this GGUF's vocabulary (only SentencePiece ones) |
 */
export type ErrorCode =
  | 'ERR_INVALID_ARG'
  | 'ERR_CONTEXT_DISPOSED'
  | 'ERR_CONTEXT_BUSY'
  | 'ERR_BRANCH_DISPOSED'
  | 'ERR_BRANCH_PARKED'
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
  | 'ERR_STATE_MISMATCH'
  | 'ERR_STATE_CORRUPT'
  | 'ERR_UNSUPPORTED'
  | 'ERR_INTERNAL'
  | 'ERR_CHAT_TEMPLATE'
  | 'ERR_CHAT_PARSE'
  | 'ERR_RPC_UNREACHABLE'
  | 'ERR_DEVICE'
  | 'ERR_CONTEXT_LOST'
  | 'ERR_NO_PROJECTOR'
  | 'ERR_PROJECTOR_LOAD'
  | 'ERR_PROJECTOR_MISMATCH'
  | 'ERR_IMAGE_DECODE'
  | 'ERR_IMAGE_FORMAT'
  | 'ERR_IMAGE_TOO_LARGE'
  | 'ERR_IMAGE_POSITIONS'
  | 'ERR_IMAGE_UNSUPPORTED'
  | 'ERR_TOKENIZER_UNSUPPORTED'
  | 'ERR_NATIVE_LOAD'
  | 'ERR_QUEUE_FULL'
  | 'ERR_SCHEDULER_CLOSED'
  | 'ERR_TOO_MANY_BRANCHES'
  | 'ERR_PROGRAM_STATE'
  | 'ERR_VOCAB_MISMATCH';

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

/**
 * The backend devices of this process (CPU, GPUs) and, with `rpcServers`, each server's.
 * Synchronous; with servers it waits for their answers (at most 15 s, then `ERR_RPC_UNREACHABLE`).
 */
export declare function listDevices(options?: ListDevicesOptions): DeviceDescription[];

/**
 * Starts llama.cpp's RPC server on this process's devices, on a thread of its own. It serves
 * until the process exits (it cannot be stopped) and does not keep Node's event loop alive. One
 * client process at a time. Throws `ERR_INVALID_ARG` for a non-loopback host without
 * `allowRemote`, or a port it cannot bind.
 */
export declare function serveRpc(options: ServeRpcOptions): RpcServerInfo;

/**
 * Which build of the native addon to use. `'default'` (same as `'cpu'`): the normal resolution,
 * i.e. `LLAMA_BRANCH_BINARY`, else a local source build, else the prebuilt platform package
 * (whose CPU backend is chosen at run time for the CPU). `'cuda'` / `'vulkan'`: a source build
 * kept beside the CPU one in `build/<variant>/` (`LLAMA_BRANCH_FEATURES=vulkan npm run build --
 * --out build/vulkan`), else `build/` when it was built with that cargo feature; else, for
 * `'vulkan'`, the prebuilt `llama-branch-<platform>` once it loaded its Vulkan module package
 * `llama-branch-<platform>-vulkan` (e.g. `llama-branch-linux-x64-gnu-vulkan`) and found a device;
 * for `'cuda'`, a platform package `llama-branch-<platform>-cuda` (this project builds none).
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
  /**
   * Creates a context on this build: the same {@link SessionContext} the package's
   * {@link createContext} returns (the reference's loader contract: a binding is valid when it has
   * `createContext`, and programs written for it call `loadBinary().createContext(options)`).
   */
  createContext(options: ContextOptions): Promise<SessionContext>;
  /** That build's llama.cpp system line (see {@link systemInfo}). */
  systemInfo(): string;
  /** The devices that build sees (see {@link listDevices}); e.g. a Vulkan build's GPUs. */
  listDevices(options?: ListDevicesOptions): DeviceDescription[];
  /** The context class: the exported {@link SessionContext} for every build (contexts of any build are `instanceof` it). */
  readonly SessionContext: typeof SessionContext;
}

/**
 * Loads the model (shared between contexts on the same file) and creates a llama.cpp context,
 * off the main thread, with the build `loadOptions.gpuVariant` selects (see {@link loadBinary}).
 * Rejects with `ERR_MODEL_NOT_FOUND`, `ERR_MODEL_LOAD`, `ERR_CONTEXT_CREATE`, `ERR_INVALID_ARG`
 * (also for malformed `loadOptions` or an unknown variant), `ERR_DEVICE` (a placement that does
 * not fit the devices or the model), `ERR_RPC_UNREACHABLE` (an RPC server that does not answer),
 * or `ERR_NATIVE_LOAD` when no build of the requested variant loads.
 */
export declare function createContext(options: ContextOptions, loadOptions?: LoadOptions): Promise<SessionContext>;

/**
 * The native binding for `variant` (default: the one `require('llama-branch')` loaded), loaded
 * once per process and file. Throws `ERR_NATIVE_LOAD` when no build of that variant loads (the
 * message lists where it looked and how to get one), `ERR_INVALID_ARG` for an unknown variant.
 * Only one prebuilt (shared-library) build can be active in a process, since the dynamic linker
 * shares llama.cpp's libraries by name: a second is refused with `ERR_NATIVE_LOAD`. Load a GPU
 * variant's package in a process that has not loaded another prebuilt.
 */
export declare function loadBinary(variant?: GpuVariant): NativeBinding;

// SessionContext, Branch, BranchStore and Scheduler are declared from lib/'s JSDoc (types/, generated by
// scripts/lib-typings.js): each method is documented once, next to its code.
import { SessionContext, MediaPrompt } from './types/Context';
import { Branch } from './types/Branch';
import { BranchStore } from './types/BranchStore';
import { Scheduler } from './types/Scheduler';
import { ProgramLine } from './types/ProgramLine';
import { PromptLookup, DraftModel } from './types/speculative';
export { SessionContext, MediaPrompt, Branch, BranchStore, Scheduler, ProgramLine, PromptLookup, DraftModel };

// The option and result shapes the addon takes and returns are declared once, in Rust (the
// `#[napi(object)]` structs of src/napi/, documented there), and generated into lib/native.d.ts.
export type {
  AdvancedSamplingParams,
  DeviceDescription,
  ImageStats,
  PromptPiece,
  DryParams,
  KvFileContents,
  ListDevicesOptions,
  MirostatParams,
  OffloadInfo,
  PenaltyParams,
  Produced,
  RpcServerInfo,
  SamplingParams,
  ServeRpcOptions,
  TokenBias,
  TokenLogprob,
  TopLogprob,
  VerifiedDraft,
  XtcParams,
} from './lib/native';
// The ones this file also uses in its own declarations.
import type {
  ContextOptions as NativeContextOptions,
  DeviceDescription,
  KvPressureInfo,
  ListDevicesOptions,
  RpcServerInfo,
  SamplingParams,
  ServeRpcOptions,
  TopLogprob,
} from './lib/native';
/**
 * One part of a prompt of text and images ({@link SessionContext.tokenizeParts}): text (a string
 * or `{ text }`), an image file's bytes (PNG, JPEG, GIF or BMP; a `Uint8Array`/`Buffer` or
 * `{ image }`), or `{ imagePath }`, a file read on the worker. Never a URL.
 */
export type PromptPart = string | Uint8Array | { text: string } | { image: Uint8Array } | { imagePath: string };

/** KV cache usage, counting cells shared by forks once: `{ nCtx, cellsUsed, remaining }`. */
export type KvPressure = KvPressureInfo;

/** Options for {@link createContext}: the native ones, with `modelPath` also taking a `file:` URL. */
export interface ContextOptions extends Omit<NativeContextOptions, 'modelPath'> {
  /**
   * Path of a `.gguf` model file, or a `file:` URL. Contexts created on the same file with the
   * same `useMmap` and placement share one loaded model; a model on RPC servers is loaded per
   * context.
   */
  modelPath: string | URL;
  /**
   * Where the model runs: `'auto'` (default) puts every layer on the GPUs this build sees (a
   * prebuilt sees Vulkan devices when `llama-branch-<platform>-vulkan` is installed and loads),
   * else the CPU; `'vulkan'` insists on the Vulkan devices (`ERR_DEVICE` saying why there is none);
   * `false` or `'cpu'` keeps everything on the CPU even with a GPU present (with `devices` or
   * `rpcServers` naming others: `ERR_INVALID_ARG`). `ctx.offload` says what happened.
   */
  gpu?: 'auto' | 'vulkan' | 'cpu' | false;
  /**
   * Compile the GPU pipelines of every batch size the context can meet right after creation, in
   * the background (one throwaway decode per size class; see {@link SessionContext.ready} and
   * {@link SessionContext.warmup}), so that the first step at a new number of branches does not
   * stall. `'auto'` (default): when layers went to a local GPU, not on the CPU or RPC servers;
   * `true`: always; `false`: never; an object: on, with its settings.
   */
  warmup?: boolean | 'auto' | WarmupOptions;
}

/** Settings of a context's warm-up ({@link ContextOptions.warmup}). */
export interface WarmupOptions {
  /** Largest batch (tokens in one decode) to warm. Default and cap: the context's `nBatch`. */
  maxTokens?: number;
  /**
   * Cache lengths (cells) after which batches of 1 to 64 tokens are decoded again, since the
   * attention kernels change with the cache length. Default: 1,024 and every fourfold length
   * that fits `nCtx`; `[]` for none. Each costs one untimed prefill of that length.
   */
  cacheLengths?: number[];
  /** Called after each warm-up decode with the status so far. */
  onProgress?: (status: WarmupStatus) => void;
}

/** Where a context's warm-up stands ({@link SessionContext.warmup}, {@link SessionContext.ready}). */
export interface WarmupStatus {
  /**
   * `'off'`: none was asked for (or `'auto'` found no GPU); `'warming'`: under way; `'ready'`:
   * done; `'cancelled'`: the context was disposed first; `'failed'`: a warm-up decode failed
   * (`error` says why; the context still works).
   */
  state: 'off' | 'warming' | 'ready' | 'cancelled' | 'failed';
  /** Warm-up decodes run so far. */
  done: number;
  /** Warm-up decodes planned. */
  total: number;
  /** Milliseconds from its start to its end (or to now). */
  ms: number;
  /**
   * Each decode: its token count, the cache length it ran after, and its milliseconds (-1:
   * skipped, no free sequence or cells then).
   */
  sizes: Array<{ tokens: number; after: number; ms: number }>;
  /** Why it failed. */
  error?: string;
}

/**
 * llama.cpp's chat formats (`common_chat_format`) by name: the numbers
 * {@link SessionContext.formatChat} reports as `format` and `parseChatOutput` takes. Built at load
 * from the llama.cpp this package was compiled with; the list changes between llama.cpp
 * versions. The last, `GENERIC`, is llama-branch's own: the JSON tool-call format used with
 * templates that cannot render tools (see docs/server.md, "Tool calls").
 */
export declare const ChatFormat: {
  readonly CONTENT_ONLY: 0;
  readonly PEG_SIMPLE: 1;
  readonly PEG_NATIVE: 2;
  readonly PEG_GEMMA4: 3;
  readonly PEG_MINIMAX_M3: 4;
  readonly GENERIC: 5;
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

/**
 * A part of a chat message's content: text, or (on a context with an image projector) an image as
 * file bytes or a file path (docs/images.md).
 */
export type ChatContentPart =
  { type: 'text'; text: string } | { type: 'image'; image: Uint8Array } | { type: 'image'; imagePath: string };

/** A chat message in OpenAI's format (other fields, e.g. `tool_calls`, `tool_call_id`, are passed on). */
export interface ChatMessage {
  role: string;
  content?: string | ReadonlyArray<ChatContentPart> | null;
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
  /** The rendered prompt; with image parts, `<__media__>` where each image goes (a display: use `parts`). */
  prompt: string;
  /**
   * Only when the messages hold image parts: the prompt as prompt parts, strings and images (file
   * bytes, or `{ imagePath }`) in order, for {@link SessionContext.tokenizeParts}.
   */
  parts?: PromptPart[];
  /** Extra stop strings of the template (beyond the model's end-of-generation tokens). */
  stopTokens: string[];
  format: ChatFormat;
  /** GBNF for tool calls or `jsonSchema` / `grammar`; `''` when unconstrained. */
  grammar: string;
  /** When true, install `grammar` lazily (`branch.setGrammar(grammar, {triggerWords, ...})`). */
  grammarLazy: boolean;
  /** The prompt ends inside an open thinking block. */
  thinkingForcedOpen: boolean;
  /** The template has a thinking section (reasoning can be split from the content). */
  supportsThinking: boolean;
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

/**
 * Runs `fn` synchronously on the context's logits view ({@link SessionContext.getLogits}) and
 * returns its result. The view is revoked by the next decode, so the work must finish inside.
 * Throws `ERR_INVALID_ARG` if `fn` returns a promise (the callback must be synchronous).
 */
/**
 * Reads and checks one file of a Scheduler's `cacheDir` against `ctx` (its checksum and its
 * fingerprint: model, llama.cpp state version, KV types and layout). Rejects with
 * `ERR_STATE_CORRUPT` (truncated, corrupted, not such a file) or `ERR_STATE_MISMATCH` (a state
 * from another model or KV settings, which `ctx` must never load). A prefix with images: each
 * image's positions hold its keys in `tokens` (negative numbers derived from the image's bytes,
 * never token ids) and `images` says where each sits and its id (the SHA-256 of its bytes).
 */
export declare function readPrefixCacheFile(
  ctx: SessionContext,
  file: string,
): Promise<{ tokens: number[]; images: { start: number; nPos: number; id: string }[]; stateBytes: number }>;

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
 * (e.g. `haswell`, `icelake`, `zen4`), and `GPU_MODULES = vulkan: 1 device(s) | ` (or `off (why)`)
 * when it looked for GPU module packages; a source build has its CPU backend compiled in.
 */
export declare function systemInfo(): string;

/** What loading one GPU backend module package into the prebuilt did (see {@link gpuModules}). */
export interface GpuModuleStatus {
  /** `'vulkan'`. */
  variant: string;
  /** The package, e.g. `llama-branch-linux-x64-gnu-vulkan`. */
  package: string;
  /** The module file, when the package is installed. */
  file: string | null;
  loaded: boolean;
  /** Devices it registered. */
  devices: number;
  /** Why it is off: not installed, no `libvulkan.so.1`, no driver, no device, ... (null when on). */
  error: string | null;
  /**
   * When the module is installed but found no working device: the system libraries or driver
   * parts missing, each with the command or setting that adds it (empty when nothing on the
   * system explains it, and when the module works).
   */
  diagnosis: GpuModuleFinding[];
}

/** One missing piece found by the Vulkan diagnosis (see {@link GpuModuleStatus.diagnosis}). */
export interface GpuModuleFinding {
  /** What is missing, e.g. `libvulkan.so.1` or `libGLdispatch.so.0`. */
  missing: string;
  /** Why it matters here. */
  why: string;
  /** What installs it, e.g. `sudo apt-get install -y libglvnd0`. */
  fix: string;
}

/**
 * The GPU backend module packages a prebuilt looked for at load time and what each did; empty in
 * a source build (its backends are compiled in). `LLAMA_BRANCH_GPU=cpu` skips them all.
 * `npx llama-branch devices` prints them with the devices.
 */
export declare function gpuModules(): GpuModuleStatus[];

// -------------------------------------------------------------------------------------------------
// Sampling

/** Options of {@link BranchStore.saveTree}. */
export interface SaveTreeOptions {
  /** Your own text stored with the tree (e.g. JSON of your search's bookkeeping), returned as `meta` by {@link BranchStore.restoreTree}. */
  meta?: string;
}

/** What {@link BranchStore.saveTree} resolves with (sizes in bytes). */
export interface SavedTree {
  /**
   * The saved branches: the root first, every parent before its children (the order
   * {@link BranchStore.restoreTree} gives them back in); null where a branch's wrapper was
   * already garbage-collected (its branch is being freed).
   */
  branches: Array<Branch | null>;
  /** Size of the file. */
  bytes: number;
  /** Bytes of KV cells in the file: every shared prefix once, each branch's own cells once. */
  kvBytes: number;
  /** Bytes of logits snapshots in the file (a fork that has not moved since shares its parent's). */
  logitsBytes: number;
  /** Branches stored without the prefix they share with their parent. */
  sharedBranches: number;
}

/** What {@link BranchStore.restoreTree} resolves with. */
export interface RestoredTree {
  /** The restored root (`branches[0]`). */
  root: Branch;
  /** Every restored branch, in the order {@link SavedTree.branches} had. */
  branches: Branch[];
  /** Each branch's parent as an index into `branches` (-1 for the root). */
  parents: number[];
  /** The `meta` text saved with the tree ('' when none). */
  meta: string;
  /** Size of the file. */
  bytes: number;
}

/** {@link Branch.parkedInfo} of a parked branch. */
export interface ParkedInfo {
  /** Cells it shared with its parent when parked: tagged back on resume, never copied. */
  shared: number;
  /** Its own cells, kept in RAM or in the spill file. */
  own: number;
  /** The spill file while its state is on disk; null while in RAM. */
  file: string | null;
}

/** Options of {@link BranchStore.setParkSpill}. */
export interface ParkSpillOptions {
  /** Bytes of parked state kept in host memory; the oldest beyond it spill to `dir`. */
  ramBytes?: number;
  /** The folder of spill files (created when missing); required with `ramBytes`. */
  dir?: string;
}

/** What {@link BranchStore.parkStats} returns (sizes in bytes). */
export interface ParkStats {
  /** Branches parked now. */
  parked: number;
  /** Host memory parked branches take: their cells, snapshots and kept sampling candidates. */
  ramBytes: number;
  /** Bytes of their spill files. */
  diskBytes: number;
  /** Parked branches whose state is in a spill file. */
  spilled: number;
  /** Why the last spill failed (those branches stayed in RAM); null when none did. */
  lastSpillError: string | null;
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

/** One step of `for await (const { token, text } of branch)`. */
/**
 * Where speculative decoding gets its drafts (docs/speculative.md): `lookup` (n-grams of the
 * line's own history; `true` or the n-gram sizes), `draft` (a smaller model's context with the
 * same vocabulary, or a {@link DraftModel}), or any `source` with `open(history)`. `maxDraft`
 * (1..32, default 8) caps a draft; the length used adapts per line to its acceptance and to the
 * measured cost of a verified row, down to none when drafting does not pay.
 */
export interface SpeculativeOptions {
  lookup?: boolean | { ngramMin?: number; ngramMax?: number };
  draft?: SessionContext | DraftModel;
  source?: DraftSource;
  maxDraft?: number;
  /**
   * Adapt each line's draft length (default true). The adaptive length follows measured step
   * times, and a different draft length is a different batch shape whose logits differ in the
   * last bits (CPU decodes are not batch-invariant), so sampled runs are reproducible bit for
   * bit only with `adaptive: false` (every draft as long as the source gives, up to `maxDraft`).
   */
  adaptive?: boolean;
}

/** A draft source: one drafter per line of generation. */
export interface DraftSource {
  open(history: readonly number[]): Drafter;
  /** Optional: drafts for many lines at once (the Scheduler calls it once per step). */
  draftMany?(drafters: Drafter[], tokens: number[], ks: number[]): Promise<number[][]>;
}

/** One line's drafter. */
export interface Drafter {
  /** Up to `k` tokens that may follow the line's history plus `token`. */
  draft(token: number, k: number): number[] | Promise<number[]>;
  /** What was committed: the token and the accepted draft tokens. */
  accept(tokens: readonly number[]): void;
  close(): void;
  /** Optional: a line's one-time work before its first draft (kept out of the measured step cost). */
  prepare?(): Promise<void>;
}

/** Draft statistics: tokens drafted, draft tokens accepted, verification steps. */
export interface SpeculativeStats {
  drafted: number;
  accepted: number;
  steps: number;
}

/** Options of {@link Branch.generate}. */
export interface BranchGenerateOptions {
  /** Tokens to generate at most. Default 256. */
  maxTokens?: number;
  /** Speculative decoding; off by default. */
  speculative?: SpeculativeOptions;
  /** The tokens the branch holds (its prompt): what prompt lookup searches. Default none. */
  history?: readonly number[];
  /** Called with each token as it is accepted. */
  onToken?: (token: BranchToken) => void;
  signal?: AbortSignal;
}

/** What {@link Branch.generate} resolves with. */
export interface BranchGenerateResult {
  tokens: number[];
  text: string;
  /** `'stop'` at an end-of-generation token (not included), `'length'` at `maxTokens`. */
  finishReason: 'stop' | 'length';
  speculative: SpeculativeStats;
}

export interface BranchToken {
  token: number;
  text: string;
}

// -------------------------------------------------------------------------------------------------
// Branches

// -------------------------------------------------------------------------------------------------
// Serving: the Scheduler (continuous batching, prefix cache) and the OpenAI-compatible server

/** Why a choice ended: a stop string or end-of-generation token, `maxTokens`, or an abort. */
/** `'tool_calls'`: a chat request with tools whose choice ended with parsed tool calls. */
export type FinishReason = 'stop' | 'length' | 'abort' | 'tool_calls';

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
  /**
   * A decode step's time budget in milliseconds (the server's `--step-budget-ms`). Extra lines —
   * a program's forks, a request's second and later `n` choices — take their branches only while
   * the step, predicted from its rows by a fit to the steps measured, stays within it, a
   * program's waiting extra lines all together or none; a request's first choice and a program's
   * root line are never held back, and a step with no rows admits one program's extra lines
   * whatever the budget. Default none (every line at once).
   */
  stepBudgetMs?: number | null;
  /** Called after every step (instrumentation, benchmarks). */
  onStep?: (info: SchedulerStepInfo) => void;
  /**
   * Speculative decoding for every request's choices (requests with `logprobs` excepted): each
   * step's drafts go into its one decode next to the other rows (docs/speculative.md).
   */
  speculative?: SpeculativeOptions;
  /**
   * Host RAM for the states of cached prefixes evicted from the KV cells (bytes, or a string
   * such as `'2GiB'`): a later prompt starting with one is restored instead of prefilled.
   * Default 0 (none). See docs/serving.md, "Prefix cache tiers".
   */
  cacheRam?: number | string;
  /**
   * A folder for the states that leave RAM (and, on `close()`, for every cached prefix): kept
   * across restarts, shareable by several schedulers of the same model and settings.
   */
  cacheDir?: string;
  /** Disk the folder may take (bytes or `'20GiB'`). Default `'20GiB'`. */
  cacheDisk?: number | string;
  /** Where the prefix cache's warnings go (a file skipped, the disk tier off). Default: `process.emitWarning`. */
  onCacheWarning?: (message: string) => void;
  /**
   * Whether text a client gives — a request's `prompt`, its messages' content, a decision's state,
   * instructions and options, a program's `append(messages)` and `decide` questions — that spells
   * the model's special tokens (`<start_of_turn>`, `<|im_start|>`, …) is parsed as those control
   * tokens. Default false: it is plain text, so it cannot close a turn and open another; the chat
   * template's own markers stay control tokens either way, and text that spells none is tokenized
   * as before. `true` keeps the earlier behaviour (the server's
   * `--parse-special`). A program's `append(text)` of its own text always parses them.
   */
  parseSpecial?: boolean;
}

/** The prefix cache's RAM and disk tiers (see {@link SchedulerOptions.cacheRam}). */
export interface CacheTierStats {
  /** Prompts that started from a prefix held in the KV cells, in RAM, on disk. */
  kvHits: number;
  ramHits: number;
  diskHits: number;
  /** Prompt tokens restored from RAM or disk instead of prefilled. */
  restoredTokens: number;
  ramBytes: number;
  diskBytes: number;
  ramEntries: number;
  diskEntries: number;
  /** False once a write failed (disk full, read-only or deleted folder): RAM only from then on. */
  diskOn: boolean;
  /** States copied out of the KV cells, files written, write failures, files skipped. */
  spills: number;
  diskWrites: number;
  diskFailures: number;
  skipped: number;
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
  /** Extra lines (forks, `n` choices) the step budget held back this step (0 without one). */
  deferred: number;
  /** What the step did, line by line. */
  plan: SchedulerStepPlan;
}

/**
 * What one scheduler step did, line by line (line ids as in the events: `p1.0`, `request-3`, …):
 * the lines that took their branches (forks and fresh lines starting), what each prefilled, the
 * lines that had a row in the step's decode, and the positions restored from RAM or disk.
 */
export interface SchedulerStepPlan {
  branches: string[];
  /** `scored`: a logits row per token (a `select` or `logprob`); `image`: an image's positions. */
  prefill: { line: string; tokens: number; scored: boolean; image: boolean }[];
  decode: string[];
  restored: number;
}

/** A request for {@link Scheduler.generate}: exactly one of `prompt`, `tokens` or `messages`. */
export interface GenerateRequest {
  /**
   * Text, tokenized with the model's BOS; or, on a context with an image projector (`mmprojPath`),
   * a prompt with images: a {@link MediaPrompt} of this context's `tokenizeParts`, or the parts
   * themselves (tokenized with the BOS). A prompt with images is prefilled whole through the
   * image path (each image encoded once, the `n` choices fork after it) and bypasses the prefix
   * cache (docs/images.md); it never speculates.
   */
  prompt?: string | MediaPrompt | PromptPart[];
  /** Token ids, used as they are. */
  tokens?: number[];
  /**
   * OpenAI-style messages, rendered with the model's chat template; leading system messages are
   * cached as their own prefix. A user message's content may hold `{ type: 'image', image }`
   * parts (image file bytes; a context with a projector): the request is then one with images,
   * as for a `prompt` with images.
   */
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
  /**
   * Log-probabilities of the generated tokens: `true`, or how many most likely alternatives
   * (0..20) each token also reports. They come from the logits each token was sampled from (no
   * extra decode). Events then carry `logprob` and `top`, choices `logprobs`.
   */
  logprobs?: boolean | number;
  /** Aborting ends the request within one step: its choices finish with `'abort'`. */
  signal?: AbortSignal;
  /**
   * Tools the model may call (with `messages`). The chat layer renders them with the template
   * and constrains a call with its grammar; templates that cannot render tools (Gemma 3's) get
   * the generic JSON format ({@link ChatFormat.GENERIC}). Each choice is parsed on its own into
   * `content`, `reasoningContent` and `toolCalls`.
   */
  tools?: readonly ChatTool[];
  /** `'auto'` (default), `'none'`, `'required'`, or one named function (always called). */
  toolChoice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };
  /** Allow several calls in one reply. Default false. */
  parallelToolCalls?: boolean;
  /** Split a thinking section into `reasoningContent` (templates that have one). Default `'none'`. */
  reasoningFormat?: ReasoningFormatName;
  /** `false` switches thinking off where the template supports it. Default true. */
  enableThinking?: boolean;
  /**
   * A client's cache key (OpenAI's `prompt_cache_key`, or a `session_id`): the prefixes this
   * request caches are evicted from the KV cells and from RAM after those of requests without
   * one (docs/serving.md, "Prefix cache tiers").
   */
  cacheKey?: string;
}

/** A tool call parsed from a choice. */
export interface GeneratedToolCall {
  /** `call_` and 24 hex digits, kept from the first streamed delta to the result. */
  id: string;
  name: string;
  /** The arguments as JSON text. */
  arguments: string;
}

/** A piece of a streamed tool call (see {@link ChatDelta.toolCalls}). */
export interface ToolCallDelta {
  index: number;
  /** Only on the call's first piece. */
  id?: string;
  /** Only on the call's first piece. */
  name?: string;
  /** More of the arguments' JSON text. */
  arguments: string;
}

/** What a parsed choice's text added since the previous event (see {@link GenerationEvent.delta}). */
export interface ChatDelta {
  content?: string;
  reasoningContent?: string;
  /**
   * Tool calls as they arrive, by their index among the choice's calls: a call's first piece
   * has its `id` and `name` (and the arguments so far, maybe `''`), each later piece only more
   * `arguments` text. Concatenated per index, the pieces are the call's final arguments.
   */
  toolCalls?: ToolCallDelta[];
}

/** A parsed choice: the reply split by the chat layer. */
export interface ChatReply {
  content: string;
  reasoningContent: string;
  toolCalls: GeneratedToolCall[];
}

/**
 * A generated token with its natural-log probability under the model's distribution (raw
 * logits, before samplers and grammar) and the most likely alternatives at its position.
 */
export interface GeneratedLogprob {
  token: number;
  text: string;
  logprob: number;
  top: TopLogprob[];
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
  /** With `logprobs`: the token's log-probability. */
  logprob?: number;
  /** With `logprobs`: the most likely alternatives at the token's position. */
  top?: TopLogprob[];
  /**
   * Requests with tools or a reasoning format: what the parsed reply gained with this event
   * (null: nothing yet, e.g. inside a JSON tool call).
   */
  delta?: ChatDelta | null;
  /** Requests with tools or a reasoning format, on a choice's last event: the whole parsed reply. */
  message?: ChatReply;
}

/** One choice of a {@link GenerationResult}. */
export interface GenerationChoice {
  text: string;
  /** The generated tokens (an end-of-generation token is not included). */
  tokens: number[];
  finishReason: FinishReason;
  /** Model perplexity of the generated tokens; `Infinity` when there are none. */
  perplexity: number;
  /** With `logprobs`: one entry per generated token. */
  logprobs?: GeneratedLogprob[];
  /** Requests with tools or a reasoning format: the reply without reasoning or calls. */
  content?: string;
  reasoningContent?: string;
  toolCalls?: GeneratedToolCall[];
}

/** Token counts of a request. */
export interface GenerationUsage {
  promptTokens: number;
  /** Prompt tokens that came from the prefix cache instead of being prefilled. */
  cachedPromptTokens: number;
  completionTokens: number;
  /** With speculation: draft tokens proposed for this request, and how many were accepted. */
  draftTokens?: number;
  acceptedDraftTokens?: number;
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

/** Options of {@link Scheduler.run}. */
export interface RunOptions {
  /**
   * Lines the program holds at most at once (its root and live forks). It is admitted only when
   * that many sequence leases are free; `fork` past it throws `ERR_TOO_MANY_BRANCHES`. Default 4.
   */
  maxBranches?: number;
  /**
   * KV cells the program may write (tokens prefilled plus generated; a shared prefix counts once).
   * Reserved at admission; a gen past it rejects with `ERR_KV_FULL`. Default min(1024, nCtx).
   */
  maxCells?: number;
  /** Seeds of gens that give none are drawn from this base in order; absent or -1: random. */
  seed?: number;
  /** Aborting ends the program within one step: `run()` rejects with `ERR_ABORTED`, every line is freed. */
  signal?: AbortSignal;
}

/** Options of {@link ProgramLine.gen}. */
export interface ProgramGenOptions {
  /** New tokens at most. Default: the scheduler's `defaultMaxTokens`. */
  maxTokens?: number;
  /** Stop strings: the gen ends before the first one (it is not part of the text). */
  stop?: string | string[];
  /** Sampler of this gen. */
  params?: SamplingParams;
  /** GBNF grammar constraining this gen's text. */
  grammar?: string;
  /** A JSON schema (object or JSON text) constraining this gen's text. */
  jsonSchema?: object | string;
  /** The text is exactly one of these strings (a grammar of the alternatives). */
  choices?: string[];
  /**
   * The whole text matches this regular expression (its source; anchors implied), converted
   * through llama.cpp's JSON-schema `pattern` support (its subset of regex syntax).
   */
  regex?: string;
  /** Seed of this gen; absent: the program's next seed. */
  seed?: number;
  /** Log-probabilities of the generated tokens: `true`, or how many alternatives (0..20) each reports. */
  logprobs?: boolean | number;
}

/** What {@link ProgramLine.gen} resolves to. */
export interface ProgramGenResult {
  text: string;
  /** The generated tokens (an end-of-generation token is not included). */
  tokens: number[];
  /** `'stop'` (stop string or end of generation) or `'length'` (`maxTokens`). */
  finishReason: 'stop' | 'length';
  /** With `logprobs`: one entry per generated token. */
  logprobs?: GeneratedLogprob[];
}

/** What {@link ProgramLine.select} resolves to. */
export interface SelectResult {
  /** The winning option (now appended to the line). */
  choice: string;
  index: number;
  /** Each option's score by the method asked for (natural-log units). */
  scores: number[];
}

/** A yes/no question: the answer is the probability of yes (`true`). */
export interface NoulQuestion {
  type: 'noul';
  instructions: string;
  /** What `true` and `false` mean here (optional descriptions). */
  criteria?: { true?: string | null; false?: string | null } | null;
}

/** One of 2–255 named options: option name → description (or null), in the order given. */
export interface ChoiceQuestion {
  type: 'choice';
  instructions: string;
  criteria: Record<string, string | null>;
}

/** An ordered scale of 2–10 levels, lowest first. */
export interface ScoreQuestion {
  type: 'score';
  instructions: string;
  criteria: string[];
}

/** A typed question of {@link Scheduler.decide} (the System One / Krite Protocol v1 shapes). */
export type DecisionQuestion = NoulQuestion | ChoiceQuestion | ScoreQuestion;

export interface NoulAnswer {
  type: 'noul';
  /** The probability of yes, in [0, 1]. */
  noul: number;
}

export interface ChoiceAnswer {
  type: 'choice';
  /** The most likely option's name. */
  choice: string;
  /** Every option's probability (a softmax over the options only: they sum to 1). */
  probabilities: Record<string, number>;
  /** `(max p − 1/n) / (1 − 1/n)`: 0 when every option is as likely, 1 when one holds all. */
  confidence: number;
}

export interface ScoreAnswer {
  type: 'score';
  /** The probability-weighted level index, in [0, levels − 1]. */
  score: number;
  /** Level index ("0", "1", ...) → level name. */
  legend: Record<string, string>;
  /** Each level's probability, by level name. */
  probabilities: Record<string, number>;
  confidence: number;
}

export type DecisionAnswer = NoulAnswer | ChoiceAnswer | ScoreAnswer;

/** Options shared by {@link Scheduler.decide} and {@link ProgramLine.decide}. */
export interface DecideOptions {
  /**
   * Score each question under this many orders of its options (cyclic shifts: a choice's letters
   * move with the listing, a score's or noul's listing order rotates), 1..10, at most the option
   * count, as further forks in the same steps; the probabilities are averaged. Default 1.
   */
  permute?: number;
  /**
   * How answers are read: `'label'` (each option's label is one token where the answer starts:
   * one logits row per question; refused when the labels are not), `'text'` (the option names are
   * scored as continuations, a trie), `'auto'` (labels where they are single tokens). Default `'auto'`.
   */
  read?: 'auto' | 'label' | 'text';
  /** Questions per decision at most (more: ERR_INVALID_ARG, reason `too_many_questions`). Default 64. */
  maxQuestions?: number;
}

/** The request of {@link Scheduler.decide}. */
export interface DecideRequest extends DecideOptions {
  /** The state: text, or a JSON object (written as indented JSON). */
  state: string | Record<string, unknown>;
  /**
   * Images in the state (a context with a projector): each `<__media__>` in the state's text takes
   * the next one, the rest follow the text. Bytes, or base64 data URLs (never fetched URLs).
   */
  images?: Array<Uint8Array | string>;
  /** Question name (`^[A-Za-z0-9_.-]{1,64}$`) → question. */
  questions: Record<string, DecisionQuestion>;
  /**
   * `'chat'` (default): the state and each question are the user's turn in the model's chat
   * template and the answer the model's first token; `'raw'`: plain text, `Answer:` then the label
   * (for base models without a usable template).
   */
  template?: 'chat' | 'raw';
  /** Lines (sequence leases) the decision holds at once, 2..nSeqMax. Default max(3, nSeqMax / 2). */
  maxBranches?: number;
  signal?: AbortSignal;
}

/** What {@link Scheduler.decide} resolves to. */
export interface DecideResult {
  answers: Record<string, DecisionAnswer>;
  usage: {
    /** The state's tokens (once) plus every question fork's own tokens (and scored option texts). */
    inputTokens: number;
    stateTokens: number;
    outputTokens: 0;
    /** Input tokens served from the prefix cache (any tier): the state, and questions asked before. */
    cachedTokens: number;
    /** State tokens this decision decoded and left in the prefix cache for the next one. */
    cacheWriteTokens: number;
  };
  latencyMs: number;
}

/** A text part of an OpenAI decision's input or question (`prompt_cache_breakpoint`: a cache point). */
export interface DecisionInputText {
  type: 'input_text';
  text: string;
  prompt_cache_breakpoint?: { mode: 'explicit' } | null;
}
/** A JSON part: written into the text as indented JSON. */
export interface DecisionInputJson {
  type: 'input_json';
  data: Record<string, unknown> | Record<string, unknown>[];
}
/**
 * An image part (`image_url`: a base64 data URL; never fetched): in a user message of the input it
 * is rendered in its place (a context with a projector); a question with one gets a `refusal`.
 */
export interface DecisionInputImage {
  type: 'input_image';
  image_url: string;
  detail?: 'low' | 'high' | 'auto' | 'original' | null;
}
/**
 * One item of an OpenAI decision's `input` (OpenAI's Decisions API, `openai` npm 7.x types):
 * messages, and function / custom tool calls with their outputs (an output must name a call
 * before it). Calls and outputs are written as text turns of the chat.
 */
export type DecisionInputItem =
  | {
      type?: 'message';
      role: 'user';
      content: string | Array<DecisionInputText | DecisionInputJson | DecisionInputImage>;
    }
  | { type?: 'message'; role: 'developer' | 'system'; content: string | DecisionInputText[] }
  | {
      type?: 'message';
      role: 'assistant';
      content: string | Array<{ type: 'output_text'; text: string } | { type: 'refusal'; refusal: string }>;
      phase?: 'commentary' | 'final_answer' | null;
    }
  | { type: 'function_call'; call_id: string; name: string; arguments: string; id?: string | null }
  | { type: 'custom_tool_call'; call_id: string; name: string; input: string; id?: string | null }
  | {
      type: 'function_call_output' | 'custom_tool_call_output';
      call_id: string;
      output: string | Array<DecisionInputText | DecisionInputImage>;
      id?: string | null;
    };

/** A question's instructions in the OpenAI format: text, or text and JSON parts (an image part: a refusal). */
export type OpenAIDecisionInstructions =
  string | Array<Omit<DecisionInputText, 'prompt_cache_breakpoint'> | DecisionInputJson | DecisionInputImage>;
/** A question of an OpenAI decision: predicate, choice (2–255 typed values) or score (ordered levels). */
export type OpenAIDecisionQuestion =
  | { type: 'predicate'; name?: string; instructions: OpenAIDecisionInstructions }
  | {
      type: 'choice';
      name?: string;
      instructions: OpenAIDecisionInstructions;
      /** Typed: the string "true" and the boolean true are two options. */
      choices: Array<{ value: string | boolean; description?: string }>;
    }
  | {
      type: 'score';
      name?: string;
      instructions: OpenAIDecisionInstructions;
      levels: Array<{ label: string; description?: string }>;
    };

/** An answer of an OpenAI decision, in question order (`name` null when the question had none). */
export type OpenAIDecisionAnswer =
  | { type: 'predicate'; name: string | null; probability: number }
  | {
      type: 'choice';
      name: string | null;
      choice: string | boolean;
      probabilities: Array<{ value: string | boolean; probability: number }>;
      confidence: number;
    }
  | {
      type: 'score';
      name: string | null;
      /** The probability-weighted level index. */
      score: number;
      /** `value`: the level's index. */
      probabilities: Array<{ label: string; value: number; probability: number }>;
      confidence: number;
    }
  /** The question could not be asked (an image part, or options that do not fit the context). */
  | { type: 'refusal'; name: string | null };

/** {@link Scheduler.decide} in the shape of OpenAI's Decisions API (`POST /v1/decisions`). */
export interface OpenAIDecideRequest extends Omit<DecideOptions, 'maxQuestions'> {
  input: string | DecisionInputItem[];
  /** 1–400 questions (fewer with `maxQuestions`). */
  questions: OpenAIDecisionQuestion[];
  maxQuestions?: number;
  /** Accepted and checked (a string of at most 1024 characters); the prefix cache needs no key. */
  promptCacheKey?: string | null;
  /** Accepted and checked (at most 256 characters). */
  safetyIdentifier?: string | null;
  template?: 'chat' | 'raw';
  maxBranches?: number;
  signal?: AbortSignal;
}

/** What {@link Scheduler.decide} resolves to for an {@link OpenAIDecideRequest}. */
export interface OpenAIDecideResult {
  answers: OpenAIDecisionAnswer[];
  usage: DecideResult['usage'];
  latencyMs: number;
}

/** Options of {@link ProgramLine.decide}. */
export interface LineDecideOptions extends DecideOptions {
  /** Lines the decision holds at once beside the line (within the program's `maxBranches`). Default 3. */
  parallel?: number;
}

/** What {@link Scheduler.stats} reports. */
export interface SchedulerStats {
  running: number;
  /** Branch programs admitted and not yet ended. */
  programs: number;
  queued: number;
  /** Cached prompt prefixes (each holds one sequence lease). */
  cachedPrefixes: number;
  /** KV cells in use as of the last step (cached prefixes included). */
  cellsUsed: number;
  /**
   * Of `cellsUsed`, the cells running work holds: less what evicting every cached prefix nobody
   * uses now would free (reclaimable cells are not load). What the gRPC worker's GetLoads and
   * the `kv_cache_usage_perc` gauge report, as vLLM and SGLang count their own.
   */
  cellsInUse: number;
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
  /** Draft tokens verified (speculation), and how many were accepted. */
  draftTokens: number;
  acceptedDraftTokens: number;
  /** The RAM and disk tiers of the prefix cache; absent when it has none. */
  cacheTiers?: CacheTierStats;
  /**
   * Image encoder runs of the context (`ctx.imageStats().encodes`), present when it loaded a
   * projector (`mmprojPath`): one per image prefilled, none for a fork after it.
   */
  imageEncodes?: number;
}

/**
 * One event of a branch trace (docs/events.md): what the Scheduler reports to
 * {@link Scheduler.subscribe}, `ctx.trace` reports for a script, `llama-branch serve` sends at
 * `GET /v1/events` and records with `--trace`. Every event has `event` and `t` (ms since the
 * epoch); `request` names the request (`r1`) or program (`p1`) it belongs to (absent in a
 * script's trace), `branch` a node of its tree.
 */
export type TraceEvent =
  | { event: 'hello'; t: number; v: 1; source: 'server' | 'script'; model?: string; nCtx: number; nSeqMax: number }
  | {
      event: 'admit';
      t: number;
      request: string;
      kind: 'completion' | 'chat' | 'program';
      n?: number;
      maxTokens?: number;
      promptTokens?: number;
      cachedTokens?: number;
      /**
       * A prompt's images, in order: `id` the first 16 hex digits of the SHA-256 of the file,
       * `nPos` its positions, `bytes` its size when given as bytes, and `url` a data URL of the
       * file for the first 4 images of at most 64 KiB (a thumbnail; the others go without).
       */
      images?: { id: string; nPos: number; bytes?: number; url?: string }[];
      maxBranches?: number;
      maxCells?: number;
    }
  /** A node: a root (`parent` null) or a fork sharing its parent's first `at` tokens. */
  | { event: 'fork'; t: number; request?: string; branch: string; parent: string | null; at: number }
  /** Text that went in without sampling (a prompt, an appended turn); `n`: the branch's length after. */
  | { event: 'append'; t: number; request?: string; branch: string; text: string; n: number }
  /** A sampled token (or, `forced`, the tokens a select scored in one prefill); `ppl`: the branch's perplexity so far; `draft`: an accepted draft token. */
  | {
      event: 'token';
      t: number;
      request?: string;
      branch: string;
      text: string;
      n: number;
      ppl?: number;
      draft?: boolean;
      forced?: boolean;
    }
  /** A generation of the branch ended (`reason`: stop, length, tool_calls, abort, or a script's own). */
  | { event: 'finish'; t: number; request?: string; branch: string; reason: string; n?: number; ppl?: number }
  /** The branch was freed before it finished (a released program line, a pruned beam). */
  | { event: 'prune'; t: number; request?: string; branch: string }
  | {
      event: 'done';
      t: number;
      request: string;
      status: 'ok' | 'abort' | 'error';
      usage?: { promptTokens: number; cachedPromptTokens: number; completionTokens: number };
      error?: { code: string; message: string };
    }
  /** One scheduler step and the gauges after it. */
  | {
      event: 'step';
      t: number;
      step: number;
      rows: number;
      prefillTokens: number;
      stepMs: number;
      running: number;
      queued: number;
      cellsUsed: number;
      nCtx: number;
      leasesUsed: number;
      nSeqMax: number;
      /** What the step did, line by line. */
      plan?: SchedulerStepPlan;
      cache: {
        entries: number;
        tokens: number;
        hitRate: number;
        evictions: number;
        /** With RAM/disk tiers: hits per tier, bytes per tier, prompt tokens restored instead of prefilled. */
        tiers?: {
          kvHits: number;
          ramHits: number;
          diskHits: number;
          ramBytes: number;
          diskBytes: number;
          restoredTokens: number;
          diskOn: boolean;
        };
      };
    }
  /** Cached prefixes evicted during the step that follows. */
  | { event: 'evict'; t: number; entries: number };

/** What `ctx.trace(listener)` returns. */
export interface BranchTrace {
  /** The branch's id in this trace (`b1`, ...); undefined for one made before the trace started. */
  idOf(branch: Branch): string | undefined;
  /** Marks `branch` finished with `reason` (e.g. `'best'`): shown as a result, not pruned. */
  finish(branch: Branch, reason: string): void;
  /** Stops the trace. */
  stop(): void;
}

/** Options of {@link createServer}: `ctx` or `modelPath`. */
export interface ServerOptions {
  /** Serve on this context (the server does not dispose it). */
  ctx?: SessionContext;
  /** Or load this model (the server's context is disposed by {@link LlamaBranchServer.close}). */
  modelPath?: string;
  /**
   * With `modelPath`: the model's image projector (mmproj GGUF, `serve --mmproj`). Chat messages
   * may then hold `image_url` parts as base64 data URLs (docs/images.md); `/v1/models` says
   * `input_modalities: ['text', 'image']`. With `ctx`, the context's own projector counts.
   */
  mmprojPath?: string;
  /**
   * With `mmprojPath`: the largest image file a request may send, in bytes
   * ({@link ContextOptions.imageMaxBytes}; default 20 MiB; larger is a 400 `image_too_large`).
   * The CLI's `--image-max-bytes`.
   */
  imageMaxBytes?: number;
  /**
   * With `mmprojPath`: the most pixels (width × height) an image may have
   * ({@link ContextOptions.imageMaxPixels}; default 4096 × 4096). The CLI's `--image-max-pixels`.
   */
  imageMaxPixels?: number;
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
  /**
   * Where the contexts the server loads run (the main one, the embeddings and draft ones):
   * {@link ContextOptions.gpu}. Default `'auto'`. The CLI's `--gpu auto|vulkan|cpu`.
   */
  gpu?: ContextOptions['gpu'];
  /** Layers of a loaded model on the GPU ({@link ContextOptions.nGpuLayers}). The CLI's `--n-gpu-layers`. */
  nGpuLayers?: number;
  /** KV key type of the contexts the server loads ({@link ContextOptions.typeK}). The CLI's `--cache-type-k`. */
  typeK?: ContextOptions['typeK'];
  /** KV value type ({@link ContextOptions.typeV}). The CLI's `--cache-type-v`. */
  typeV?: ContextOptions['typeV'];
  /** Flash attention ({@link ContextOptions.flashAttention}). The CLI's `--flash-attn`. */
  flashAttention?: ContextOptions['flashAttention'];
  /**
   * Bitwise-reproducible logits in every context the server loads
   * ({@link ContextOptions.deterministic}; docs/determinism.md). The CLI's `--deterministic`.
   */
  deterministic?: boolean;
  /**
   * Warm-up of the contexts the server loads ({@link ContextOptions.warmup}); `/health` answers 503
   * `"warming up"` until it is over. The CLI's `--no-warmup` sets `false`.
   */
  warmup?: ContextOptions['warmup'];
  /** Scheduler options (`maxRunning` defaults to `parallel`). */
  scheduler?: SchedulerOptions;
  /** Largest accepted request body, in bytes. Default 1 MiB. */
  maxBodyBytes?: number;
  /** Keys every request but `/health` must send as `Authorization: Bearer KEY`. Default: none (open). */
  apiKeys?: string | string[];
  /** Origin allowed to call from a browser (`Access-Control-Allow-Origin`), or `'*'`. Default: none. */
  cors?: string;
  /** Serve `/v1/embeddings` from a second context on `modelPath` (mean pooling, 2048 tokens). */
  embeddings?: boolean;
  /** Or serve `/v1/embeddings` from this context (created with `embeddings: true`). */
  embeddingsCtx?: SessionContext;
  /** How chat replies are split into reasoning and content. Default `'auto'`. */
  reasoningFormat?: ReasoningFormatName;
  /**
   * A Jinja chat template for the context the server opens on `modelPath`, instead of the
   * model's own (`createContext`'s `chatTemplate`; the CLI's `--chat-template-file`). With
   * `ctx`, create that context with it instead.
   */
  chatTemplate?: string;
  /**
   * Speculative decoding for every request: `'lookup'` (prompt lookup), `'draft'` (a draft model
   * at `modelDraft`, opened and owned by the server) or `'none'` (default). `scheduler.speculative`
   * takes the full {@link SpeculativeOptions} instead.
   */
  speculative?: 'lookup' | 'draft' | 'none';
  /** The draft model of `speculative: 'draft'`: a smaller GGUF with the same vocabulary. */
  modelDraft?: string;
  /** The longest draft a request verifies per step (1..32). Default 8. */
  specMaxDraft?: number;
  /** Largest `max_tokens` a request may ask for. Default 4096. */
  maxTokensLimit?: number;
  /** Largest `n`. Default 16. */
  maxN?: number;
  /** Most questions one `POST /v1/systemone` request may ask (more: a 400 `too_many_questions`). Default 64. */
  maxQuestions?: number;
  /** Serve the live page of the branch trees at `/`. Default true (`GET /v1/events` is served either way). */
  ui?: boolean;
  /** Record every scheduler event to this JSONL file (docs/events.md), replayable in the page. */
  traceFile?: string;
  /**
   * Publish the prefix cache as KV events in vLLM's format (ZeroMQ PUB on `tcp://HOST:PORT`, port 0
   * picks one; topic `kv@<pod>@<model>`) for KV-aware routers; docs/serving.md.
   */
  kvEvents?: string;
  /**
   * The KV events' encoding: `'map'` (default: what current vLLM sends, maps tagged by `type` with
   * `group_idx`, `kv_cache_spec_kind`, and `extra_keys` naming the images in a block) or `'array'`
   * (vLLM's earlier positional arrays, for consumers that read only those).
   */
  kvEventsFormat?: 'map' | 'array';
  /**
   * Also serve SMG's gRPC engine protocol (`vllm.grpc.engine.VllmEngine`: generation, Abort, KV
   * events from the same source as `kvEvents`, the tokenizer as Hugging Face files) on this port
   * (0 picks one), for exact cache-aware routing by `smg launch --worker-urls grpc://HOST:PORT`;
   * docs/deployment.md.
   */
  grpcPort?: number;
  /** The gRPC worker's host. Default `'127.0.0.1'` (the CLI passes `--host`). */
  grpcHost?: string;
}

/** An OpenAI-compatible HTTP server over a {@link Scheduler}; see docs/serving.md. */
export interface LlamaBranchServer {
  readonly ctx: SessionContext;
  readonly scheduler: Scheduler;
  readonly modelName: string;
  /** The underlying node:http server. */
  readonly http: import('node:http').Server;
  /** With `kvEvents`: the bound address and topic of the KV event stream; null without. */
  readonly kvEvents: {
    address: string;
    topic: string;
    publisher: { readonly sequence: number; readonly format: 'map' | 'array' };
  } | null;
  /** With `grpcPort`: the gRPC worker's address (`grpc://HOST:PORT`, for `smg --worker-urls`) and port; null without. */
  readonly grpc: { address: string; port: number; worker: unknown } | null;
  /** Starts listening (default port 8080 on 127.0.0.1; port 0 = any free port). */
  listen(port?: number, host?: string): Promise<{ host: string; port: number; url: string }>;
  /** Stops listening, ends running requests, closes the scheduler (and disposes a loaded context). */
  close(): Promise<void>;
}

/**
 * Creates the OpenAI-compatible server (`POST /v1/completions`, `POST /v1/chat/completions`,
 * `POST /v1/embeddings`, `GET /v1/models`, `GET /v1/events`, `GET /metrics`, `GET /health`, and the page at `/`) on a context or a model file. Rejects like
 * {@link createContext} when loading fails, `ERR_INVALID_ARG` for bad options.
 */
export declare function createServer(options: ServerOptions): Promise<LlamaBranchServer>;
