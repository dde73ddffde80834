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
   * later, contexts using it are lost (`ERR_CONTEXT_LOST`); see README "Multi-host (RPC)".
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

/**
 * A llama.cpp context plus its branch store and worker thread. Created by {@link createContext}
 * only. Asynchronous methods run on the context's worker thread in call order (FIFO).
 *
 * The raw methods (`decode`, `getLogits`, `kv*`) work on sequences that no live branch leases;
 * a leased sequence must be driven through the {@link Branch} API. The lease rule in detail:
 * - reads work on any sequence: `kvSeqPosMax`, `kvCacheSize`, `kvCacheSave`, `kvCacheWriteFile`
 *   and the source of `kvSeqCopy`;
 * - writes to one sequence (`decode`, `decodeAndCapture`, `kvCacheRemove`, `kvCacheLoad`,
 *   `kvCacheReadFile`, the destination of `kvSeqCopy`) reject with `ERR_INVALID_ARG` when a live
 *   branch leases it;
 * - whole-cache writes (`kvCacheClear`, `clearAndReseed`) reject while any branch is alive, and
 *   `kvSeqKeep(seqId)` while any branch on another sequence is alive.
 */
export declare class SessionContext {
  private constructor();

  /** Number of tokens in the vocabulary (the length of every logits row). */
  get vocabSize(): number;
  /** Size of the model's tensors in bytes. */
  get memorySize(): number;
  /** Effective KV cache size in cells. */
  get nCtx(): number;
  /** Effective maximum tokens per decode. */
  get nBatch(): number;
  /** Number of KV sequences (branch leases). */
  get nSeqMax(): number;
  /** True after {@link dispose}. Never throws. */
  get disposed(): boolean;
  /** Where the model's layers went. */
  get offload(): OffloadInfo;
  /** True once an RPC server the context uses died: every call then fails with `ERR_CONTEXT_LOST`. */
  get lost(): boolean;
  /** llama.cpp's one-line model description, e.g. `"gemma3 270M Q4_K - Medium"`. */
  get modelDescription(): string;
  /**
   * The model's sliding-window attention span in positions (0 when it has none; Gemma 3: 512).
   * {@link Branch.forkAt} below a branch's own position is refused once the branch is past it.
   */
  get slidingWindow(): number;

  /**
   * Frees the context. Idempotent. A running operation finishes first; queued ones reject with
   * `ERR_CONTEXT_DISPOSED`, as does every later call (except `disposed` and `dispose`).
   */
  dispose(): void;

  /**
   * Tokenizes `text` on the worker thread. Special tokens written in the text (e.g.
   * `<start_of_turn>`) are parsed.
   * @param addSpecial add the model's BOS (and other special prefix) tokens. Default true.
   */
  tokenize(text: string, addSpecial?: boolean): Promise<number[]>;
  /** Synchronous {@link tokenize}. Does not need an idle context. */
  tokenizeSync(text: string, addSpecial?: boolean): number[];
  /** Turns token ids back into text, on the worker thread. */
  detokenize(tokens: number[]): Promise<string>;
  /** The text piece of one token. Does not need an idle context. */
  tokenToText(token: number): string;
  /** Whether `token` ends generation (EOS, EOT, ...). Does not need an idle context. */
  isStopToken(token: number): boolean;
  /** The end-of-generation token (EOT, else EOS). Throws `ERR_UNSUPPORTED` if the model has neither. */
  getEogToken(): number;
  /** The BOS token, or null if the model has none. */
  getBosToken(): number | null;

  /**
   * Raw decode of `tokens` into sequence `seqId` (default 0) starting at `position`, chunked by
   * `nBatch`; logits are computed for the last token. `position` must continue the sequence
   * (`kvSeqPosMax(seqId) + 1`, or 0 for an empty one). Refused (`ERR_INVALID_ARG`) on a sequence
   * leased by a live branch. Rejects with `ERR_KV_FULL` past `nCtx` or when llama.cpp finds no
   * free KV cells, and with `ERR_DECODE` when `llama_decode` fails otherwise; on failure the
   * cells written by this call are removed again. Rejects with `ERR_ABORTED` when
   * `options.signal` aborts it (the sequence then holds none of these tokens).
   */
  decode(tokens: number[], position: number, seqId?: number, options?: OperationOptions): Promise<void>;
  /** `decode(tokens, position, options)`: sequence 0 with an {@link OperationOptions}. */
  decode(tokens: number[], position: number, options: OperationOptions): Promise<void>;
  /**
   * A zero-copy view of the context's last logits row (length `vocabSize`): the last token of
   * the last decode of any kind. Per-branch snapshots are on {@link Branch.getLogits}.
   *
   * The view is **revoked** (its ArrayBuffer is detached: `length` becomes 0, reads give
   * `undefined`) as soon as an operation that may rewrite the logits is started: any decode
   * (`decode`, `decodeAndCapture`, `clearAndReseed`, branch and store `commit` / `prefill` /
   * `decodeAndCaptureOne`), `kvCacheClear`, `kvCacheRemove`, `kvCacheLoad`, `kvCacheReadFile`,
   * `dispose`, and any other asynchronous context method except `tokenize` / `detokenize` /
   * `kvCacheSave` / `kvCacheWriteFile`. Copy it (`Float32Array.from(view)`) to keep values.
   * Calls within one step share one buffer, and writes through the view are seen by
   * `greedySample()`, `modelEntropy()` and `modelSurprisal()` (e.g. to mask tokens).
   * Throws `ERR_NO_LOGITS` before the first decode.
   */
  getLogits(): Float32Array;
  /** Argmax of the context's last logits row (ties: the lowest id). Sees writes through {@link getLogits}. */
  greedySample(): number;
  /**
   * Raw decode (as {@link decode}; `seqId` is required) that then copies the last token's logits
   * into `dest`, a `Float32Array` or `ArrayBuffer` of at least `vocabSize` floats. `dest` is
   * checked before anything is decoded (`ERR_INVALID_ARG`); the copy is independent of the
   * context and is taken right after the decode, before any later queued operation runs.
   */
  decodeAndCapture(tokens: number[], position: number, seqId: number, dest: Float32Array | ArrayBuffer): Promise<void>;
  /**
   * Entropy of the softmax of `logits` (default: the context's last logits row). Non-finite
   * logits (masked tokens) are left out. A given `logits` must be a Float32Array of length
   * `vocabSize` (else `ERR_INVALID_ARG`).
   * @param base `'nats'` (default) or `'bits'`.
   */
  modelEntropy(base?: EntropyBase, logits?: Float32Array): number;
  /**
   * Surprisal `-log p(token)` under `logits` (default: the context's last logits row); `Infinity`
   * for a masked token. `token` outside the vocabulary throws `ERR_TOKEN_OUT_OF_RANGE`; a given
   * `logits` must be a Float32Array of length `vocabSize` (else `ERR_INVALID_ARG`).
   * @param base `'nats'` (default) or `'bits'`.
   */
  modelSurprisal(token: number, base?: EntropyBase, logits?: Float32Array): number;

  /** Highest position stored for the sequence, or -1 when it is empty. */
  kvSeqPosMax(seqId: number): number;
  /**
   * Same as `kvSeqPosMax(seqId)` (default sequence 0): the highest position, or -1 when empty.
   * Note: this is not a cell count (a sequence holding 3 tokens returns 2).
   */
  kvCacheSize(seqId?: number): number;
  /** Empties the whole KV cache. Rejects with `ERR_INVALID_ARG` while any branch is alive. */
  kvCacheClear(): Promise<void>;
  /**
   * Removes positions `[start, end)` of a sequence no live branch leases (`-1` means "from the
   * start" / "to the end"). Rejects with `ERR_STATE` if the model's memory cannot remove a
   * partial range.
   */
  kvCacheRemove(seqId: number, start: number, end: number): Promise<void>;
  /**
   * Makes `dst` hold sequence `src`'s cells at positions `[p0, p1)` (default: all; `-1` means
   * "from the start" / "to the end"). Cells are shared, not duplicated. `dst` is cleared first,
   * must differ from `src` and must not be leased by a live branch.
   */
  kvSeqCopy(src: number, dst: number, p0?: number, p1?: number): void;
  /**
   * Removes the cells of every sequence except `seqId`. Throws `ERR_INVALID_ARG` while a live
   * branch holds another sequence (use `store.retainOnly` to keep one branch).
   */
  kvSeqKeep(seqId: number): void;
  /**
   * Clears the whole KV cache, then decodes `sinks` at position 0 and `tail` right after them
   * into sequence 0 (logits for the last token; the next position is `sinks.length +
   * tail.length`). Rejects with `ERR_INVALID_ARG` when both are empty or while any branch is
   * alive, with `ERR_KV_FULL` when they exceed `nCtx` (checked before clearing).
   */
  clearAndReseed(sinks: number[], tail: number[]): Promise<void>;
  /**
   * The state (KV cells) of sequence `seqId` (default 0) as a Buffer for {@link kvCacheLoad}:
   * loading it back into a context of the same model and settings restores the same next-token
   * logits. Works on leased sequences too. Rejects with `ERR_INVALID_ARG` if the sequence is empty.
   */
  kvCacheSave(seqId?: number): Promise<Buffer>;
  /**
   * Replaces sequence `seqId`'s cells with a state from {@link kvCacheSave} (the buffer is copied
   * at call time). Rejects with `ERR_INVALID_ARG` for an empty buffer or a leased sequence, and
   * with `ERR_STATE` when the data is not a state, is truncated, has trailing bytes, comes from
   * another model or configuration, or does not fit in the free cells; the sequence then keeps
   * its previous cells. (Corrupted tensor bytes inside a well-formed state cannot be detected.)
   */
  kvCacheLoad(seqId: number, state: Buffer | Uint8Array): Promise<void>;
  /**
   * Writes sequence `seqId`'s state and `tokens` (usually the tokens it holds, for your own
   * bookkeeping) to the file `path`, replacing it. Resolves the bytes written. Rejects with
   * `ERR_INVALID_ARG` for an empty sequence, an empty or unwritable path, or more than `nCtx`
   * tokens.
   */
  kvCacheWriteFile(seqId: number, path: string, tokens: number[]): Promise<number>;
  /**
   * Loads a file written by {@link kvCacheWriteFile} into sequence `seqId` (replacing its cells)
   * and resolves the stored tokens and the file size. Rejects with `ERR_INVALID_ARG` when the
   * file cannot be opened or the sequence is leased, and with `ERR_STATE` when the file is not a
   * valid state file for this model and context; the sequence then keeps its previous cells.
   */
  kvCacheReadFile(seqId: number, path: string): Promise<KvFileContents>;

  // ---------------------------------------------------------------------------------------------
  // Chat (the model's Jinja chat template, rendered and parsed by llama.cpp's own chat layer)

  /**
   * Renders `messages` (OpenAI-style, as JSON text or as an array) with the model's chat template,
   * or with `options.templateOverride` (a string second argument is also taken as the override).
   * A model without a template gets Gemma's template when its vocabulary has Gemma's turn tokens,
   * llama.cpp's ChatML otherwise. The prompt carries no BOS text: tokenize it with the default
   * `addSpecial` for the first turn.
   *
   * A leading `{role: 'system', content: ''}` message means "only this turn": the rest of the
   * messages are rendered exactly as they appear after an earlier exchange, ready to append to a
   * conversation in the KV cache after {@link SessionContext.getTurnSeparator} (see the README's Chat section).
   *
   * Runs on the context's worker. Rejects with `ERR_INVALID_ARG` (messages, tools, toolChoice or
   * reasoningFormat malformed) or `ERR_CHAT_TEMPLATE` (the template fails to parse or render,
   * e.g. roles that do not alternate); it never falls back to another prompt format.
   */
  formatChat(messages: string | readonly ChatMessage[], options?: FormatChatOptions | string): Promise<FormattedChatResult>;
  /** {@link formatChat} on the calling thread (the template renders while JavaScript waits). */
  formatChatSync(messages: string | readonly ChatMessage[], options?: FormatChatOptions | string): FormattedChatResult;
  /** The module's {@link jsonSchemaToGrammar} as a member (it uses no context state). */
  jsonSchemaToGrammar(schema: string | object): Promise<string>;
  /** The module's {@link jsonSchemaToGrammarSync} as a member. */
  jsonSchemaToGrammarSync(schema: string | object): string;
  /**
   * Splits model output into content, reasoning and tool calls with the parser `formatChat`
   * built. Pass `format` and the formatChat result (or at least its `parser` and
   * `generationPrompt`) as options; without a `parser` the whole output is content.
   * Throws `ERR_CHAT_PARSE` when the output does not match the format (`isPartial: true` accepts
   * an unfinished output while streaming), `ERR_INVALID_ARG` for malformed options.
   * Synchronous; usable while the context is busy.
   */
  parseChatOutput(output: string, format: ChatFormat, options?: ParseChatOutputOptions): ParseChatOutputResult;
  /** Whether `template` is a Jinja chat template llama.cpp can parse and render (runs on the worker). */
  validateChatTemplate(template: string): Promise<boolean>;
  /**
   * Tokens that close an assistant turn before the next message: the template's text between an
   * assistant message and the next user message, tokenized, up to its first end-of-generation
   * token plus trailing whitespace tokens (Gemma: `<end_of_turn>`, `"\n"`; ChatML:
   * `<|im_end|>`, `"\n"`). Falls back to `[EOT or EOS]` when the template yields nothing usable.
   * Computed once per context. Usable while the context is busy.
   */
  getTurnSeparator(): number[];

  // --- Sampling from the context's logits (src/session/api.rs) ---

  /**
   * Samples a token from the context's last logits row (the same row {@link getLogits} reads).
   *
   * - No `params` (or `undefined`/`null`): argmax, exactly {@link greedySample}; stateless.
   * - With `params`: runs a sampler chain kept **per context** and accepts the chosen token into
   *   it, so penalties see every token this method returned. The chain persists between calls
   *   while the resolved params are equal (deep comparison, a new object with the same values
   *   counts as equal); any change rebuilds it, which empties the penalty history and restarts
   *   the RNG from `seed` (a seeded chain then replays its draws). Same defaults and validation
   *   as a Branch's params (`temperature` 0.8, `topK` 40, ...; `{ temperature: 0 }` is argmax).
   *   `logitBias` applies; `grammar` is refused (`ERR_INVALID_ARG`): use
   *   {@link createSampler} + {@link applySampler}, or a Branch with a grammar.
   *
   * Throws `ERR_NO_LOGITS` before any decode, `ERR_INVALID_ARG` for bad params,
   * `ERR_GRAMMAR` if `logitBias` bans every token. Runs after any queued operation.
   */
  sample(params?: SamplingParams | null): number;

  // --- Grammar sampler handles ---

  /**
   * Parses a GBNF grammar (root rule `root`) into a grammar sampler and returns its handle (a
   * positive integer, valid on this context only). Throws `ERR_GRAMMAR` for an empty or
   * malformed grammar. Handles are freed by {@link freeSamplerHandle} or {@link dispose}.
   */
  createSampler(grammar: string): number;
  /**
   * Masks `logits` in place: every token the grammar forbids in its current state becomes
   * `-Infinity`; allowed entries are unchanged. `logits` must be a Float32Array of length
   * `vocabSize` (else `ERR_INVALID_ARG`). Runs after any queued operation.
   */
  applySampler(handle: number, logits: Float32Array): void;
  /**
   * Advances the grammar by `token`. A token the grammar forbids (including end-of-generation
   * before the grammar is complete) throws `ERR_GRAMMAR_REJECTED` and leaves the grammar as it
   * was.
   */
  acceptSamplerToken(handle: number, token: number): void;
  /** A new handle with a copy of the grammar's current parse state. */
  cloneSampler(handle: number): number;
  /**
   * Frees a grammar sampler. An unknown or already freed handle throws `ERR_INVALID_ARG` (as
   * for every handle method; perplexity trackers behave the same way).
   */
  freeSamplerHandle(handle: number): void;

  // --- Perplexity trackers (work at any time, even while the context is busy) ---

  /** A new tracker (count 0) and its handle. Freed by {@link freePerplexityTracker} or {@link dispose}. */
  createPerplexityTracker(): number;
  /**
   * Adds one surprisal, in nats (e.g. `modelSurprisal(token)`). Non-finite values (a token the
   * distribution excluded) are ignored and not counted; negative values count as 0.
   */
  addSurprisal(handle: number, surprisal: number): void;
  /** `exp(mean surprisal)`; `Infinity` while the count is 0. */
  getPerplexity(handle: number): number;
  /** Number of surprisals counted. */
  getPerplexityCount(handle: number): number;
  /** Sets the count and sum back to 0. */
  resetPerplexityTracker(handle: number): void;
  /** A new, independent tracker with the same count and sum. */
  clonePerplexityTracker(handle: number): number;
  /** Frees a tracker. Unknown or already freed handles throw `ERR_INVALID_ARG`, as do all tracker methods. */
  freePerplexityTracker(handle: number): void;

  // --- Embeddings (contexts created with `embeddings: true`) ---

  /**
   * Computes embeddings for `tokens` (at most `nBatch`, one decode, nothing truncated): sequence
   * 0 is **cleared first**, then the tokens go to positions `0..n-1` of it, so successive calls
   * are independent. Rejects with `ERR_UNSUPPORTED` on a context without `embeddings: true`,
   * `ERR_INVALID_ARG` for an empty or too long input or when a live branch leases sequence 0.
   */
  encode(tokens: number[]): Promise<void>;
  /**
   * A copy of the embedding of the last {@link encode} (length {@link getEmbeddingDimension}):
   * pooled over sequence 0 (`poolingType` MEAN, CLS or LAST), or the last token's vector with
   * `PoolingType.NONE`. L2-normalised unless `normalize` is false. Throws `ERR_NO_LOGITS` before
   * the first encode, `ERR_UNSUPPORTED` on a non-embedding context or with `PoolingType.RANK`.
   */
  getEmbeddings(normalize?: boolean): Float32Array;
  /** Length of the embedding vectors (the model's embedding width). Works on any context, at any time. */
  getEmbeddingDimension(): number;
  /** True when the context pools token embeddings per sequence (`poolingType` not NONE). Any time. */
  hasPooling(): boolean;
}

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

/**
 * One line of generation: a leased KV sequence plus its own sampler chain, grammar, logits
 * snapshot and perplexity trackers. Create roots with {@link Branch.create}, children with
 * {@link Branch.fork}. Free with {@link prune}, {@link pruneSubtree}, {@link destroy} or
 * {@link BranchStore.retainOnly}; a branch garbage-collected without being freed is pruned at the
 * next opportunity.
 */
export declare class Branch implements AsyncIterable<BranchToken> {
  private constructor();

  /**
   * Root branch on sequence `seqId`, adopting the prefix the caller decoded there with
   * `ctx.decode(tokens, 0, seqId)`. `position` must be where that prefix ends
   * (`ctx.kvSeqPosMax(seqId) + 1`, or 0 for an empty sequence). Call {@link captureLogits} right
   * after the raw decode to sample from it. On an empty sequence with `position > 0` the branch
   * is created ahead of its prefix: copy it in with `ctx.kvSeqCopy(src, seqId)` (the copy must
   * end at `position`) before decoding or forking from it (`ERR_INVALID_ARG` until then). A
   * `seqId` of `nSeqMax` or more is `ERR_INVALID_ARG` saying which `nSeqMax` to create.
   * @param nBatch per-branch cap for {@link prefill} chunks, in [1, ctx.nBatch]. Default ctx.nBatch.
   * @param grammar GBNF grammar; overrides `params.grammar`.
   */
  static create(
    ctx: SessionContext,
    seqId: number,
    position: number,
    params?: SamplingParams,
    nBatch?: number,
    grammar?: string,
  ): Branch;
  /**
   * Root branch on a free sequence picked by the store (usually with `position` 0, then
   * {@link prefill} the prompt). Throws `ERR_NO_FREE_SEQUENCE` when all leases are taken.
   */
  static create(
    ctx: SessionContext,
    position: number,
    params?: SamplingParams,
    nBatch?: number,
    grammar?: string,
  ): Branch;

  /**
   * A child sharing this branch's KV prefix (no copy) with independent copies of its sampler
   * chain (including RNG state), grammar state, logits snapshot and perplexity. Steer biases are
   * not inherited. `seqId` requests a specific free lease.
   */
  fork(seqId?: number): Branch;
  /**
   * {@link fork} (already synchronous; the name of the reference's later surface).
   */
  forkSync(seqId?: number): Branch;
  /**
   * A child sharing only this branch's cells below `position` — a prefix of its tokens, e.g. a
   * shared system prompt — without copying them. Unless `position` is this branch's own, the
   * child has no logits snapshot (prefill at least one token before sampling), fresh
   * perplexities, and a fresh sampler chain and grammar built from this branch's parameters
   * (the parent's RNG, penalty window and grammar state describe tokens the child lacks).
   * `position` must be in `[0, position]` of this branch. On a model with sliding-window
   * attention (Gemma 3: 512 positions) a fork below the parent's own position is refused with
   * `ERR_UNSUPPORTED` once the parent is past the window: llama.cpp may already have reused the
   * cells the child would need. Keep a branch at the prefix (a prefix cache does) and fork that.
   */
  forkAt(position: number, seqId?: number): Branch;
  /** Copies the context's last logits row into this branch (after a raw `ctx.decode` for it). */
  captureLogits(): void;
  /** A copy of this branch's logits snapshot (length `vocabSize`). Throws `ERR_NO_LOGITS` if none. */
  getLogits(): Float32Array;
  /** Entropy of the snapshot distribution, in `'nats'` (default) or `'bits'`. */
  entropy(base?: EntropyBase): number;
  /**
   * Samples a token from the snapshot through the full pipeline, without accepting it or writing
   * KV. Throws `ERR_GRAMMAR` if every candidate is masked.
   */
  sample(): number;
  /** Accepts `token` into the sampler (penalty window), grammar and perplexity trackers. No decode. */
  accept(token: number): void;
  /** {@link sample} plus the token's text and stop flag. */
  produce(): Produced;
  /** {@link produce} (already synchronous; the name of the reference's later surface). */
  produceSync(): Produced;
  /**
   * Accepts `token` and decodes it, refreshing the logits snapshot. All-or-nothing: on failure
   * the branch is unchanged. Rejects with `ERR_GRAMMAR_REJECTED`, `ERR_KV_FULL`, `ERR_ABORTED`, ...
   */
  commit(token: number, options?: OperationOptions): Promise<void>;
  /**
   * Decodes tokens the model did not sample (prompt, user turn, tool output), in chunks of this
   * branch's `nBatch`, without accepting them. An empty array is a no-op. All-or-nothing: an
   * abort (`options.signal`) or failure after some chunks removes all of them again.
   */
  prefill(tokens: number[], options?: OperationOptions): Promise<void>;
  /** Decodes one token without accepting it, and captures its logits. Cancellable. */
  decodeAndCaptureOne(token: number, options?: OperationOptions): Promise<void>;
  /** Replaces this branch's dynamic biases (`bias` finite or `-Infinity` to ban). */
  steer(biases: TokenBias[]): void;
  /** Removes the dynamic biases set by {@link steer}. */
  clearSteer(): void;
  /** Reseeds the random stage (integer in [0, 2^32)); no effect on greedy chains. */
  reseedSampler(seed: number): void;
  /**
   * Rebuilds the sampler chain from `params` (penalty window and RNG start fresh). A `grammar` in
   * `params` replaces the current one; without it the current grammar is kept.
   */
  setSamplerParams(params: SamplingParams): void;
  /**
   * Installs a GBNF grammar; `null` or `''` removes it. With `lazy` triggers the grammar only
   * applies once a trigger appears.
   */
  setGrammar(grammar: string | null, lazy?: LazyGrammarTriggers): void;
  /**
   * Frees this branch and its KV tags; its children live on (re-parented to its parent). Resolves
   * at once when the context is idle, else after the pending operation. No-op when disposed.
   */
  prune(): Promise<void>;
  /** Frees this branch and all of its descendants. No-op when disposed. */
  pruneSubtree(): Promise<void>;
  /** {@link prune} done before returning: waits for operations queued on the context, then frees. */
  pruneSync(): void;
  /** {@link pruneSubtree} done before returning (as {@link pruneSync}). */
  pruneSubtreeSync(): void;
  /**
   * Frees the branch object but keeps its KV cells for raw `ctx` calls; returns the sequence id
   * (reserved until its cells are removed, e.g. `ctx.kvCacheRemove(seq, -1, -1)`), or undefined
   * if the branch was already disposed.
   */
  destroy(): number | undefined;

  /** Opaque native handle (a non-zero integer), as used by {@link parent} and {@link children}. */
  get handle(): number;
  /** True once pruned, destroyed or released by `retainOnly`. Never throws. */
  get disposed(): boolean;
  /** The leased KV sequence id. */
  get seqId(): number;
  /** The next position to write (number of tokens in this branch's sequence). */
  get position(): number;
  /** Position at which this branch was forked (0 for roots). */
  get forkHead(): number;
  /** Model perplexity of accepted tokens (raw logits); `Infinity` before the first accept. */
  get perplexity(): number;
  /** Perplexity under the distribution actually sampled from (after filters and temperature). */
  get samplingPerplexity(): number;
  /** Handle of the parent branch, or null for a root. */
  get parent(): number | null;
  /** Handles of the live child branches. */
  get children(): number[];
  /** True when the branch has no live children. */
  get isLeaf(): boolean;
  /** `!disposed`. */
  get isActive(): boolean;

  /**
   * `for await (const { token, text } of branch)`: produces, commits, then yields each token;
   * stops (without committing) at an end-of-generation token or when the branch is disposed.
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<BranchToken>;
}

/** Batched operations over many branches of one context: one `llama_decode` per step. */
export declare class BranchStore {
  /** Throws `ERR_INVALID_ARG` for a non-context, `ERR_CONTEXT_DISPOSED` for a disposed one. */
  constructor(ctx: SessionContext);

  /**
   * `[[branch, token], ...]`: accepts each token into its branch, then ONE decode for all of them.
   * All-or-nothing (also when `options.signal` aborts it). Each branch may appear once; at most
   * `ctx.nBatch` entries.
   */
  commit(entries: ReadonlyArray<readonly [Branch, number]>, options?: OperationOptions): Promise<void>;
  /**
   * `[[branch, tokens], ...]`: decodes variable-length runs bin-packed into `nBatch`-sized
   * decodes; no accept. All-or-nothing (also when `options.signal` aborts it).
   */
  prefill(entries: ReadonlyArray<readonly [Branch, number[]]>, options?: OperationOptions): Promise<void>;
  /** Samples every branch in one native call (no KV write, no accept). */
  produce(branches: readonly Branch[]): Produced[];
  /**
   * Keeps only `winner` (one `seq_keep` pass): every other branch of the context is freed and its
   * wrapper becomes disposed. `winner` becomes a root. Runs in call order after queued operations.
   */
  retainOnly(winner: Branch): Promise<void>;
  /** Number of free sequence leases. */
  get available(): number;
  /** Exact KV usage (cells shared by forks counted once). */
  kvPressure(): KvPressure;
}

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

/**
 * Continuous batching over one context: independent {@link generate} calls share every step's
 * decode (ONE `store.produce` + ONE `store.commit` for all running choices of all requests),
 * newcomers' prompts are prefilled in chunks of `prefillChunk` tokens per step, finished prompts
 * stay cached (radix tree over tokens, LRU eviction of unused ones when cells or leases run
 * short), and requests that do not fit wait in a bounded FIFO queue.
 *
 * The scheduler must be the only user of `ctx` while it runs. Size the context for the load:
 * `nSeqMax` ≥ running requests × (n + 1) plus cached prefixes, `nCtx` ≥ their prompts + n ×
 * maxTokens each.
 */
export declare class Scheduler {
  constructor(ctx: SessionContext, options?: SchedulerOptions);
  /** Queues a request; see {@link Generation}. Never throws: errors reject the result. */
  generate(request: GenerateRequest): Generation;
  /** Counters and gauges (never busy). */
  stats(): SchedulerStats;
  /**
   * Queued requests reject with `ERR_SCHEDULER_CLOSED`, running ones end with `'abort'`, then
   * every cached prefix is freed. Idempotent. The context stays open.
   */
  close(): Promise<void>;
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

/** An OpenAI-compatible HTTP server over a {@link Scheduler}; see the README's "Serving". */
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
