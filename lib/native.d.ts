// Generated from the #[napi] items in src/napi/ by scripts/native-typings.js. Do not edit:
// change the Rust, run `npm run build`, then `node scripts/native-typings.js`.
import type { ChatMessage, FormatChatOptions, FormattedChatResult, LogLevel, ParseChatOutputResult, PoolingType } from '../index';

export declare class CancelToken {
  constructor()
  /** Requests cancellation; idempotent and safe at any time (the job may already be done). */
  cancel(): void
  get cancelled(): boolean
}

/**
 * A prompt of text and images, tokenized by the context's projector: text runs as token ids
 * and images as chunks the projector encodes when the prompt is prefilled.
 */
export declare class MediaPrompt {
  /** The pieces in order: text runs (their tokens) and images (positions, id). */
  get pieces(): Array<PromptPiece>
  /** Positions the whole prompt takes in a sequence. */
  get nPos(): number
  /** Images in the prompt. */
  get nImages(): number
}

export declare class SessionContext {
  _branchCreate(position: number, params?: SamplingParams | undefined | null, nBatch?: number | undefined | null, seqId?: number | undefined | null): number
  /**
   * A child sharing the parent's cells; with `position`, only those below it (the child then
   * has no logits and a fresh sampler chain from the parent's parameters).
   */
  _branchFork(handle: number, seqId?: number | undefined | null, position?: number | undefined | null): number
  /**
   * Frees the branch and its KV tags (its children are re-parented), in call order with the
   * context's queued operations. Resolves the freed handles.
   */
  _branchPrune(handle: number): Promise<number[]>
  /** Frees the branch and all its descendants, in call order (as `_branchPrune`). */
  _branchPruneSubtree(handle: number): Promise<number[]>
  /** `_branchPrune` on the calling thread, after any queued operation; returns the freed handles. */
  _branchPruneSync(handle: number): Array<number>
  /** `_branchPruneSubtree` on the calling thread, after any queued operation. */
  _branchPruneSubtreeSync(handle: number): Array<number>
  /**
   * Frees a branch whose JS object was garbage-collected without being freed, before the
   * context's next operation (see `Released`). Silent: there is nobody to tell, and a branch
   * already freed is fine.
   */
  _branchRelease(handle: number): void
  /** Frees the branch but keeps its KV; returns the sequence id now usable with raw calls. */
  _branchDestroy(handle: number): number
  _branchInfo(handle: number): BranchInfo
  _branchPosition(handle: number): number
  _branchCaptureLogits(handle: number): void
  _branchGetLogits(handle: number): Float32Array
  _branchLogprob(handle: number, token: number, top: number): TokenLogprob
  _branchEntropy(handle: number, base?: string | undefined | null): number
  _branchSample(handle: number): number
  _branchAccept(handle: number, token: number): void
  _branchProduce(handle: number): Produced
  _branchSteer(handle: number, biases: Array<TokenBias>): void
  _branchReseed(handle: number, seed: number): void
  _branchSetSamplerParams(handle: number, params: SamplingParams): void
  /**
   * `grammar` empty or null removes it. With triggers the grammar is lazy: unconstrained until
   * a trigger pattern (regex over generated text) or trigger token appears.
   */
  _branchSetGrammar(handle: number, grammar?: string | undefined | null, triggerPatterns?: Array<string> | undefined | null, triggerTokens?: Array<number> | undefined | null): void
  /** Decodes one token without accepting it (no sampler, grammar or perplexity update). */
  _branchDecodeAndCaptureOne(handle: number, token: number, cancel: CancelToken | undefined): Promise<void>
  /** Prefill of one branch, chunked by that branch's own nBatch. */
  _branchPrefill(handle: number, tokens: number[], cancel: CancelToken | undefined): Promise<void>
  /** Renders `messages` with the model's Jinja chat template (llama.cpp's chat layer). */
  formatChat(messages: string | readonly ChatMessage[], options?: FormatChatOptions | string): Promise<FormattedChatResult>
  /** `formatChat` on the calling thread: the template renders while JS waits. */
  formatChatSync(messages: string | readonly ChatMessage[], options?: FormatChatOptions | string): FormattedChatResult
  /** Parses model output in the given chat format into content, reasoning and tool calls. */
  parseChatOutput(output: string, format: number, options?: object | undefined | null): ParseChatOutputResult
  /** Whether `template` is a Jinja chat template llama.cpp can parse and render. */
  validateChatTemplate(template: string): Promise<boolean>
  /** Tokens that close an assistant turn before the next message (cached per context). */
  getTurnSeparator(): Array<number>
  get vocabSize(): number
  get memorySize(): number
  get nCtx(): number
  get nBatch(): number
  get nSeqMax(): number
  get nOutputs(): number
  get typeK(): 'f16' | 'q8_0' | 'q4_0'
  get typeV(): 'f16' | 'q8_0' | 'q4_0'
  get flashAttention(): 'auto' | 'on' | 'off'
  /** Whether the context was created with `deterministic: true` (docs/determinism.md). */
  get deterministic(): boolean
  /**
   * Where the model's layers went: `{ layers, totalLayers, devices }` (layers on non-CPU
   * devices, out of the model's layers plus its output layer).
   */
  get offload(): OffloadInfo
  /**
   * Whether the context was lost (an RPC server it uses died); every call then fails with
   * `ERR_CONTEXT_LOST`.
   */
  get lost(): boolean
  get disposed(): boolean
  /**
   * The model's sliding-window attention span in positions (0 when it has none): `forkAt`
   * below a branch's position is refused once the branch is past it.
   */
  get slidingWindow(): number
  get modelDescription(): string
  /** Frees the context. Idempotent. A running operation finishes first; queued ones reject. */
  dispose(): void
  /**
   * Whether pairs of single-token branches decode as two 1-row batches on this machine
   * (measured when the context was created).
   * The token counts a warm-up decodes once each (engine/warmup.rs), ascending, up to
   * `maxTokens` (default and cap: nBatch, or nCtx when smaller).
   */
  _warmUpSizes(maxTokens?: number | undefined | null): Array<number>
  /**
   * Warm-up decodes on a scratch sequence (one no branch leases and that holds no cells):
   * for each of `sizes`, that many throwaway tokens in one decode, every row's logits asked
   * for when the output buffer allows (as a step of that many branches does), each removed
   * again before the next. With `after` > 0 the sequence first gets `after` untimed cells, so
   * that the timed decodes attend over a longer cache (attention kernels change with its
   * length). Resolves with each decode's milliseconds, -1 for one that could not run (no
   * scratch sequence, or too few free cells); nothing is left behind either way.
   */
  _warmUp(sizes: number[], after?: number): Promise<number[]>
  get _splitPairs(): boolean
  /**
   * Throws the error `code` names, with the message defined in `error.rs`: for the few checks
   * lib/ makes before reaching native code (a wrapper already disposed), so that JS never
   * repeats a message.
   */
  _throwCoded(code: string): void
  get _embeddings(): boolean
  /**
   * Replaces sequence 0 with `tokens` (positions 0..n-1, one decode) and computes their
   * embeddings. At most `nBatch` tokens.
   */
  encode(tokens: number[]): Promise<void>
  /**
   * Embeds each of `inputs` (token arrays) on a sequence of its own, as many per decode as
   * fit `nBatch` tokens and `nSeqMax` sequences: a pooled vector per input, in order
   * (L2-normalised unless `normalize` is false). Every input is checked before anything runs.
   */
  embedBatch(inputs: number[][], normalize: boolean | undefined | null): Promise<Float32Array[]>
  /**
   * The embedding of the last `encode`: pooled over sequence 0, or the last token's when the
   * context has no pooling. L2-normalised unless `normalize` is false.
   */
  getEmbeddings(normalize?: boolean | undefined | null): Float32Array
  /** Length of the vectors `getEmbeddings()` returns (the model's embedding width). */
  getEmbeddingDimension(): number
  /** True when the context pools token embeddings into one vector per sequence. */
  hasPooling(): boolean
  /** Whether the context loaded an image projector (`mmprojPath`). */
  get hasProjector(): boolean
  /** Encoder counters; zeros without a projector. Never waits. */
  imageStats(): ImageStats
  /**
   * Tokenizes a prompt of text and images on the worker (images decoded, checked against the
   * limits and preprocessed; not encoded yet).
   */
  _tokenizeParts(parts: PromptPartInput[], addSpecial?: boolean): Promise<MediaPrompt>
  /**
   * Prefill of a `MediaPrompt` into one branch: text runs decoded as a prefill, each image
   * encoded then decoded as one batch of embedding rows. All or nothing. `from`/`to`: the
   * prompt's positions to prefill (default: all), e.g. the rest after a cached start; a range
   * that cuts an image is ERR_IMAGE_POSITIONS.
   */
  _branchPrefillMedia(handle: number, prompt: MediaPrompt, cancel: CancelToken | undefined, from: number | undefined, to: number | undefined): Promise<void>
  /**
   * The media prefills of one Scheduler step in ONE worker job: entry `i` prefills
   * `prompts[i]`'s positions `froms[i]..tos[i]` into branch `handles[i]`, each all or nothing
   * as `_branchPrefillMedia`. Resolves with one item per entry: null, or the failure of that
   * entry alone (its code and message), so one request's bad image never fails the others.
   * Malformed arguments reject the whole call before anything runs.
   */
  _storePrefillMedia(handles: number[], prompts: MediaPrompt[], froms: number[], tos: number[]): Promise<Array<MediaPrefillFailure | null>>
  /** Argmax of the context's last logits row. */
  greedySample(): number
  modelEntropy(base?: string | undefined | null, logits?: Float32Array | undefined | null): number
  modelSurprisal(token: number, base?: string | undefined | null, logits?: Float32Array | undefined | null): number
  createPerplexityTracker(): number
  /**
   * Adds one surprisal in nats. Non-finite values are ignored (not counted); negative values
   * count as 0.
   */
  addSurprisal(handle: number, surprisal: number): void
  /** `exp(mean surprisal)`; `Infinity` while nothing has been counted. */
  getPerplexity(handle: number): number
  getPerplexityCount(handle: number): number
  resetPerplexityTracker(handle: number): void
  clonePerplexityTracker(handle: number): number
  /** Frees a tracker. An unknown or already freed handle is an error. */
  freePerplexityTracker(handle: number): void
  /** Parks the branches (children before parents); all or nothing. */
  _storePark(handles: number[]): Promise<void>
  /** Resumes the branches and the parked ancestors they need; resolves every handle resumed. */
  _storeResume(handles: number[]): Promise<number[]>
  /** Parked state beyond `ramBytes` spills into `dir` (both null: everything stays in RAM). */
  _storeParkSpill(ramBytes?: number | undefined | null, dir?: string | undefined | null): void
  _storeParkStats(): ParkStatsInfo
  /** The parked record of a branch, or null when it is not parked. */
  _branchParked(handle: number): ParkedInfo | null
  decode(tokens: number[], position: number, seqId?: number, cancel?: CancelToken): Promise<void>
  /**
   * Raw decode (as `decode`) that also returns a copy of the last token's logits, taken on
   * the worker right after the decode. `lib/raw.js` copies it into the caller's buffer.
   */
  _decodeAndCapture(tokens: number[], position: number, seqId?: number): Promise<Float32Array>
  /**
   * Zero-copy view of the logits row of the last decode (length vocabSize), revoked by the
   * next operation that may rewrite it (see `LogitsView`).
   */
  getLogits(this: this): Float32Array
  /** Highest position in the sequence, or -1 when it is empty. */
  kvSeqPosMax(seqId: number): number
  kvCacheSize(seqId?: number | undefined | null): number
  kvCacheClear(): Promise<void>
  kvCacheRemove(seqId: number, start: number, end: number): Promise<void>
  /** Makes `dst` hold exactly `src`'s cells in positions `[p0, p1)` (default: all), shared. */
  kvSeqCopy(src: number, dst: number, p0?: number | undefined | null, p1?: number | undefined | null): void
  /** Removes every sequence's cells except `seqId`'s. */
  kvSeqKeep(seqId: number): void
  /**
   * Clears the whole KV cache, then decodes `sinks` at position 0 and `tail` right after
   * them into sequence 0 (logits for the last token).
   */
  clearAndReseed(sinks: number[], tail: number[]): Promise<void>
  /**
   * Without params: argmax of the context's last logits row (same as `greedySample()`).
   * With params: samples through a chain kept per context and rebuilt only when the resolved
   * params differ from the previous call's; the chosen token is accepted into it.
   */
  sample(params?: SamplingParams): number
  /** Parses a GBNF grammar (root rule `root`) into a new sampler handle. */
  createSampler(grammar: string): number
  /** Sets every logit the grammar forbids in its current state to -Infinity, in place. */
  applySampler(handle: number, logits: Float32Array): void
  /**
   * Advances the grammar by `token`; a token the grammar forbids is refused
   * (`ERR_GRAMMAR_REJECTED`) and leaves the grammar unchanged.
   */
  acceptSamplerToken(handle: number, token: number): void
  /** A new handle with a copy of the grammar's current parse state. */
  cloneSampler(handle: number): number
  /** Frees a grammar sampler. An unknown or already freed handle is an error. */
  freeSamplerHandle(handle: number): void
  /** The identity of the states this context's sequences hold (see `StateIdentity`). */
  _stateIdentity(): StateIdentity
  /**
   * The size in bytes of the entry file `_prefixFileWrite` writes for `nTokens` tokens (with
   * `images` among them) and a state of `stateBytes` bytes (the prefix cache's disk budget
   * counts it before writing).
   */
  _prefixFileSize(nTokens: number, stateBytes: number, images?: Array<ImageSpanObject> | undefined | null): number
  /**
   * Writes the prefix `tokens` (-1 at the positions of its `images`) with its `state` (from
   * `_branchStateSync`) to `path` as a saved-state container, atomically; resolves the file's
   * size. A failed write (a full,
   * read-only or missing folder) rejects with ERR_INVALID_ARG and the system's reason, and
   * leaves no temporary file.
   */
  _prefixFileWrite(path: string, tokens: number[], state: Buffer, images: ImageSpanObject[] | undefined): Promise<number>
  /**
   * Reads and checks a whole entry file: ERR_STATE_CORRUPT (truncated, corrupt, not such a
   * file), ERR_STATE_MISMATCH (saved by a context with another fingerprint), ERR_INVALID_ARG
   * (it cannot be opened; the message has the system's reason).
   */
  _prefixFileRead(path: string): Promise<PrefixFile>
  /**
   * An entry file's tokens from its head (a folder's listing), its fingerprint checked; the
   * checksum is verified by `_prefixFileRead`. Errors as `_prefixFileRead`.
   */
  _prefixFileTokens(path: string): Promise<PrefixFileHead>
  /** The state of one sequence (its KV cells) as a Buffer for `kvCacheLoad`. */
  kvCacheSave(seqId?: number): Promise<Buffer>
  /** Replaces sequence `seqId`'s cells with a state from `kvCacheSave`. */
  kvCacheLoad(seqId: number, state: Buffer | Uint8Array): Promise<void>
  /** Writes sequence `seqId`'s state and `tokens` to `path`; resolves the bytes written. */
  kvCacheWriteFile(seqId: number, path: string, tokens: number[]): Promise<number>
  /** Loads a `kvCacheWriteFile` file into sequence `seqId`; resolves `{tokens, bytesRead}`. */
  kvCacheReadFile(seqId: number, path: string): Promise<KvFileContents>
  /**
   * The state of a branch's sequence (its KV cells) as a Buffer, on the calling thread: the
   * prefix cache copies an entry it evicts while the scheduler decides what fits, where an
   * awaited job would leave the context busy for the synchronous calls around it.
   */
  _branchStateSync(handle: number): Buffer
  /**
   * A new root branch holding a state from `_branchStateSync` (on a vacant sequence, after
   * the queued operations), cut to its first `keep` positions when `keep` > 0 (the prefix
   * cache restores a prompt's entry one token short, so the prompt's last token gives the
   * logits a state does not carry). `images`: where the state's images sit (an entry with
   * images), those wholly below the cut kept; a cut inside one is ERR_IMAGE_POSITIONS.
   * Resolves the handle; a state llama.cpp refuses leaves nothing behind and rejects with
   * ERR_STATE.
   */
  _branchRestore(state: Buffer, keep: number, images: ImageSpanObject[] | undefined): Promise<number>
  /** Samples several branches in one native call. */
  _storeProduce(handles: Array<number>): Array<Produced>
  /** One token per branch: each is accepted into its branch, then ONE decode for all. */
  _storeCommit(handles: number[], tokens: number[], cancel: CancelToken | undefined): Promise<void>
  /**
   * One token per branch plus a draft of tokens to follow it, in ONE decode with a row per
   * token; each branch keeps the longest prefix of its draft its own sampler agrees with.
   */
  _storeCommitDrafts(handles: number[], tokens: number[], drafts: number[][], cancel: CancelToken | undefined): Promise<VerifiedDraft[]>
  /**
   * Token runs for several branches, bin-packed into nBatch-sized decodes; no accept.
   * `scoreFrom[i]` (an index into entry i's tokens, or null) also scores those tokens from
   * there on; resolves each entry's per-token log-probabilities (null where not asked).
   */
  _storePrefill(handles: number[], tokenArrays: number[][], cancel: CancelToken | undefined, scoreFrom: Array<number | null> | undefined): Promise<Array<number[] | null>>
  /** Keeps only `winner` (one `seq_keep` pass), in call order; resolves the freed handles. */
  _storeRetainOnly(handle: number): Promise<number[]>
  _storeAvailable(): number
  /** KV usage; with `without`, as if those branches were pruned (nothing is). */
  _storeKvPressure(without?: Array<number> | undefined | null): KvPressureInfo
  _storeLiveHandles(): Array<number>
  tokenize(text: string, addSpecial?: boolean, parseSpecial?: boolean): Promise<number[]>
  detokenize(tokens: number[]): Promise<string>
  tokenizeSync(text: string, addSpecial?: boolean | undefined | null, parseSpecial?: boolean | undefined | null): Array<number>
  tokenToText(token: number): string
  isStopToken(token: number): boolean
  getEogToken(): number
  getBosToken(): number | null
  /** Saves `handle`'s branch and its live descendants to `path` (atomically). */
  _storeSaveTree(handle: number, path: string, meta: string | undefined): Promise<TreeSaved>
  /** Restores a tree saved by `_storeSaveTree` onto free sequences of this context. */
  _storeRestoreTree(path: string): Promise<TreeRestored>
}

/** llama.cpp's chat format names in number order (lib/index.js builds `ChatFormat` from them). */
export declare function _chatFormatNames(): Array<string>

/**
 * Called by the JS loader for a GPU backend shipped in its own package (e.g. the Vulkan module
 * of llama-branch-linux-x64-gnu-vulkan), after `_setBackendDir`. Never throws for a module that
 * fails: the reason comes back.
 */
export declare function _loadBackendModule(path: string): ModuleLoad

/**
 * Called by the JS loader (lib/loader.js) right after loading the addon, with the folder of the
 * .node: a prebuilt's backend modules sit there. Returns the number of compute devices.
 */
export declare function _setBackendDir(dir: string): number

/** Less common samplers. */
export interface AdvancedSamplingParams {
  /** Locally typical sampling, in (0, 1]; 1 = off. Default 1. */
  typicalP?: number
  /** Mirostat in place of temperature + dist; off when absent. */
  mirostat?: MirostatParams
  /** DRY penalty; off when absent. */
  dry?: DryParams
  /** XTC; off when absent. */
  xtc?: XtcParams
  /** Top-n-sigma, > 0. Default off. */
  topNSigma?: number
}

export interface BranchInfo {
  /** -1 while parked (a parked branch holds no sequence). */
  seqId: number
  position: number
  forkHead: number
  /** 0 for a root. */
  parent: number
  children: Array<number>
  perplexity: number
  samplingPerplexity: number
  hasLogits: boolean
  stochastic: boolean
  hasGrammar: boolean
  /** Whether the branch is parked (engine/park.rs). */
  parked: boolean
}

/** Options for {@link createContext}. */
export interface ContextOptions {
  /**
   * Path of a `.gguf` model file, or a `file:` URL. Contexts created on the same file with the
   * same `useMmap` and placement share one loaded model; a model on RPC servers is loaded per
   * context.
   */
  modelPath: string
  /**
   * KV cache size in cells (tokens, summed over all sequences). Default 2048; range 16 to 2^24.
   * llama.cpp may round it up (read the effective value from `ctx.nCtx`).
   */
  nCtx?: number
  /** Maximum tokens per `llama_decode` call. Default 512 (llama.cpp caps it at `nCtx`). */
  nBatch?: number
  /** CPU threads used by decodes. Default: the number of available CPU cores. */
  nThreads?: number
  /**
   * Number of KV sequences, i.e. how many branches can be alive at once (one lease each).
   * Default 1; range 1 to 256.
   */
  nSeqMax?: number
  /**
   * Logits rows one decode may return. Default `nSeqMax + 16`; range `nSeqMax` to `nBatch`.
   * A plain step needs one row per branch; a speculative step (`commitDrafts`) one per token
   * it verifies, so raise it to run long drafts on many branches at once. Each row reserves
   * `nVocab` floats of output buffer.
   */
  nOutputs?: number
  /**
   * Create an embedding context: enables {@link SessionContext.encode} and
   * {@link SessionContext.getEmbeddings}. Default false. Every token of a decode is an output
   * row in such a context, so plain generation is slower there.
   */
  embeddings?: boolean
  /** Pooling type for embedding contexts. Default `PoolingType.MEAN` with embeddings, else `NONE`. */
  poolingType?: PoolingType
  /** Memory-map the model file. Default true. */
  useMmap?: boolean
  /** Sets the (process-wide) llama.cpp log level before loading. Default: silent (`'none'`), or `LLAMA_BRANCH_LOG`. */
  logLevel?: LogLevel
  /**
   * Layers placed on the GPU / RPC devices, counted from the output end: 0 to the model's layers
   * + 1 (the output layer). Default: all of them when such a device takes part, else 0 (ignored
   * when there is none). More than the model has: `ERR_DEVICE` (before anything loads).
   */
  nGpuLayers?: number
  /** Index (into the offload devices) of the device for `splitMode: 'none'` and row-split results. Default 0. */
  mainGpu?: number
  /**
   * How layers spread over several devices: `'none'` (all on `mainGpu`), `'layer'` (whole
   * layers per device; the default) or `'row'` (the rows of each matrix across the devices,
   * where the backend supports it, e.g. CUDA).
   */
  splitMode?: 'none' | 'layer' | 'row'
  /**
   * Relative share of the offloaded layers per device, one number per offload device in order
   * (`ctx.offload.devices`), e.g. `[1, 3]`. Default: by free memory. A wrong length: `ERR_DEVICE`.
   */
  tensorSplit?: Array<number>
  /**
   * Names (from {@link listDevices}) of the GPU / RPC devices to place layers on, in order.
   * Default: every local GPU, then the `rpcServers`' devices; `[]`: none, the CPU alone (as
   * `gpu: false`). Unknown names and the CPU: `ERR_DEVICE`.
   */
  devices?: Array<string>
  /**
   * llama.cpp RPC servers (`"host:port"`, IPv4 or a host name; started with
   * `npx llama-branch rpc-server`) whose devices take layers. Each is parsed and probed before
   * use: malformed → `ERR_INVALID_ARG`, not answering → `ERR_RPC_UNREACHABLE`. If a server dies
   * later, contexts using it are lost (`ERR_CONTEXT_LOST`); see docs/gpu-and-rpc.md, "Multi-host (RPC)".
   */
  rpcServers?: Array<string>
  /**
   * A Jinja chat template used instead of the model's own by every chat call of the context:
   * `formatChat` without a `templateOverride` of its own, `getTurnSeparator`, chat requests and
   * programs of a Scheduler on it, the server (`llama-branch serve --chat-template-file`). For
   * models whose template lacks what you need (a thinking section, tool calls). One llama.cpp
   * cannot parse or render: `ERR_CHAT_TEMPLATE` when the context is created.
   */
  chatTemplate?: string
  /**
   * Element type of the KV cache's keys: `'f16'` (default), `'q8_0'` (8.5 bits a value: about
   * half the memory) or `'q4_0'` (4.5 bits: about a quarter). A type the model's attention
   * heads cannot hold in whole blocks of 32: `ERR_INVALID_ARG`. Read back from `ctx.typeK`.
   */
  typeK?: 'f16' | 'q8_0' | 'q4_0'
  /**
   * Element type of the KV cache's values, as `typeK`. A quantized V cache needs flash
   * attention: with `flashAttention: 'off'` it is `ERR_INVALID_ARG`; with `'auto'` it turns
   * flash attention on.
   */
  typeV?: 'f16' | 'q8_0' | 'q4_0'
  /**
   * Flash attention (attention as one fused op): `'auto'` (default: llama.cpp turns it on where
   * the backend runs the op on the layers' own devices), `'on'` or `'off'`. Read back from
   * `ctx.flashAttention` (what was asked, or `'on'` when a quantized V cache forces it).
   */
  flashAttention?: 'auto' | 'on' | 'off'
  /**
   * Bitwise-reproducible logits: a sequence's logits at a position are the same bits whatever
   * else its decodes hold (1 to 64 rows, prefill and decode rows, any order), whether its
   * prefix came from a prefill in any chunking, a fork, the prefix cache, the RAM or disk tier
   * or a restored tree, for a given model, context settings and `nThreads`. Default false.
   * It turns off the CPU backend's repacked weight layouts (the model is then loaded apart
   * from contexts that keep them) and its batch-shaped kernels, and needs flash attention
   * (`'auto'` becomes `'on'`; `'off'` is `ERR_INVALID_ARG`). Costs and measurements:
   * docs/determinism.md. Read back from `ctx.deterministic`.
   */
  deterministic?: boolean
  /**
   * Path of the model's image projector (an mmproj `.gguf`, llama.cpp's tools/mtmd), loaded
   * beside the model so prompts may hold images (`ctx.tokenizeParts`, `branch.prefill`). One
   * whose output width is not the model's: `ERR_PROJECTOR_MISMATCH`; any other file llama.cpp
   * refuses: `ERR_PROJECTOR_LOAD`. Models whose images use M-RoPE positions (Qwen-VL):
   * `ERR_IMAGE_UNSUPPORTED`.
   */
  mmprojPath?: string
  /** Largest image file accepted, in bytes (default 20 MiB): larger is `ERR_IMAGE_TOO_LARGE`. */
  imageMaxBytes?: number
  /**
   * Most pixels (width × height, read from the file's header before decoding) an image may
   * have (default 4096 × 4096): more is `ERR_IMAGE_TOO_LARGE`.
   */
  imageMaxPixels?: number
}

/**
 * Loads the model (shared with contexts on the same file) and creates a context, off the
 * main thread. Rejects with a coded error; never throws.
 */
export declare function createContext(options: ContextOptions): Promise<SessionContext>

/** A backend device, from {@link listDevices}. */
export interface DeviceDescription {
  /** The name `devices` takes, e.g. `'CPU'`, `'Vulkan0'`, `'RPC0'`. */
  name: string
  /** For an RPC device: its server's `host:port`. */
  description: string
  type: 'cpu' | 'gpu' | 'rpc'
  /** Bytes (as the backend reports them; for the CPU and RPC CPU devices, the host's RAM). */
  memoryFree: number
  memoryTotal: number
}

/** DRY ("don't repeat yourself") penalty. Enabled when `multiplier` > 0. */
export interface DryParams {
  /** >= 0; 0 = off. Default 0.8. */
  multiplier?: number
  /** >= 1. Default 1.75. */
  base?: number
  /** Default 2. */
  allowedLength?: number
  /** -1 = the whole context. Default -1. */
  penaltyLastN?: number
  /** Default `["\n", ":", "\"", "*"]`. */
  sequenceBreakers?: Array<string>
}

/** Every error `code` the addon can produce (for tooling and the typings test). */
export declare function errorCodes(): Array<string>

/**
 * Where an image sits in a branch's sequence (a prefix-cache entry carries its images'
 * places so that a state restored from RAM or a file knows them again).
 */
export interface ImageSpanObject {
  /** Its first position. */
  start: number
  /** Positions it takes. */
  nPos: number
  /** The SHA-256 (hex) of the image file's bytes. */
  id: string
}

/** Encoder counters of a context (`ctx.imageStats()`). */
export interface ImageStats {
  /** Images tokenized (decoded from their files). */
  images: number
  /** Vision encoder runs: one per image prefilled, none for a fork after it. */
  encodes: number
  /** Milliseconds spent in the encoder, in total. */
  encodeMs: number
}

/** Converts a JSON schema (JSON text) to GBNF off the main thread. Rejects with a coded error. */
export declare function jsonSchemaToGrammar(schema: string): Promise<string>

/** Converts a JSON schema (JSON text) to GBNF on the calling thread (`jsonSchemaToGrammarSync`). */
export declare function jsonSchemaToGrammarSync(schema: string): string

/** What {@link SessionContext.kvCacheReadFile} resolves. */
export interface KvFileContents {
  /** The tokens stored with the state. */
  tokens: Array<number>
  /** Size of the file, in bytes. */
  bytesRead: number
}

/** KV cache usage, counting cells shared by forks once. */
export interface KvPressureInfo {
  /** Total KV cells of the context. */
  nCtx: number
  /** Cells held by live branches and by unleased sequences with content. */
  cellsUsed: number
  /** `nCtx - cellsUsed`. */
  remaining: number
}

/**
 * The backend devices of this process (CPU, GPUs) and, with `rpcServers`, those of each server
 * (probed first; memory as the server reports it). Synchronous; with servers it waits for
 * their answers (at most 15 s).
 */
export declare function listDevices(options?: ListDevicesOptions | undefined | null): Array<DeviceDescription>

export interface ListDevicesOptions {
  /** Also list the devices of these RPC servers (probed first; same errors as in {@link ContextOptions.rpcServers}). */
  rpcServers?: Array<string>
}

/** What one entry's failure was, for JS to raise as a coded error on its owner. */
export interface MediaPrefillFailure {
  code: string
  message: string
}

/** Mirostat sampling (replaces temperature/dist as the final stage). */
export interface MirostatParams {
  /** 0 = off, 1 = Mirostat, 2 = Mirostat 2.0. Default 2 when this object is present. */
  mode?: 0 | 1 | 2
  /** Target surprise, > 0. Default 5. */
  tau?: number
  /** Learning rate, > 0. Default 0.1. */
  eta?: number
}

/** What loading one more backend module did: the devices it registered, or why it did not load. */
export interface ModuleLoad {
  /** The module registered its backend. */
  loaded: boolean
  /** Devices the backend registered (0 when it loaded but found none). */
  devices: number
  /** Why it did not load (the dynamic loader's or ggml's message). */
  error?: string
}

/** Where a context's layers went ({@link SessionContext.offload}). */
export interface OffloadInfo {
  /** Layers on GPU / RPC devices (the output layer counts as one, as in llama.cpp's log). */
  layers: number
  /** The model's layers + 1. */
  totalLayers: number
  /** The devices that took layers, in order (empty: CPU only). */
  devices: Array<string>
}

/** What `branch.parkedInfo` returns for a parked branch. */
export interface ParkedInfo {
  /** Cells shared with its parent when parked (tagged back on resume, never copied). */
  shared: number
  /** Its own cells, kept in RAM or in the spill file. */
  own: number
  /** The spill file, while spilled; null while in RAM. */
  file?: string
}

/** What `store.parkStats()` returns (sizes in bytes). */
export interface ParkStatsInfo {
  /** Branches parked now. */
  parked: number
  /** Host memory their cells, snapshots and kept sampling candidates take. */
  ramBytes: number
  /** Bytes of their spill files. */
  diskBytes: number
  /** Parked branches whose state is in a spill file. */
  spilled: number
  /** Why the last spill failed (those branches stayed in RAM); null when none did. */
  lastSpillError?: string
}

/** Repetition penalties. Present (even `{}`) = enabled with these defaults. */
export interface PenaltyParams {
  /** Repeat penalty, > 0; 1 = off. Default 1. */
  repeat?: number
  /** Frequency penalty. Default 0. */
  frequency?: number
  /** Presence penalty. Default 0. */
  presence?: number
  /** Window in tokens; -1 = the whole context. Default 64. */
  lastN?: number
}

/** A prefix-cache entry file read whole (`_prefixFileRead`). */
export interface PrefixFile {
  /** The prefix; -1 at an image's positions. */
  tokens: Array<number>
  /** The images in the prefix. */
  images: Array<ImageSpanObject>
  /** The sequence state, for `_branchRestore`. */
  state: Buffer
  /** Size of the file. */
  bytes: number
}

/** A prefix-cache entry file's head (`_prefixFileTokens`). */
export interface PrefixFileHead {
  /** The prefix; -1 at an image's positions. */
  tokens: Array<number>
  /** The images in the prefix. */
  images: Array<ImageSpanObject>
  /** Size of the file. */
  bytes: number
}

/** A sampled token, not yet committed. */
export interface Produced {
  token: number
  /** The token's text piece. */
  text: string
  /** True for end-of-generation tokens. */
  isStop: boolean
}

/** One part of a prompt, as JS gives it (lib/ turns a string into `{ text }`). */
export interface PromptPartInput {
  text?: string
  /** An image file's bytes (PNG, JPEG, GIF or BMP). */
  image?: Uint8Array
  /** A path to an image file, read on the worker. */
  imagePath?: string
}

/** One piece of a tokenized prompt. */
export interface PromptPiece {
  /** `'text'` or `'image'`. */
  type: 'text' | 'image'
  /** A text piece's token ids. */
  tokens?: Array<number>
  /** Positions the piece takes in a sequence (a text piece: its token count). */
  nPos: number
  /** An image's embedding rows (equal to `nPos` for the models supported). */
  nTokens?: number
  /** An image's SHA-256 (hex) of its file bytes. */
  id?: string
}

export interface RpcServerInfo {
  endpoint: string
  /** The local devices it serves (the GPUs, else the CPU). */
  devices: Array<string>
}

/**
 * A branch's sampler chain, as `Branch.create` and `setSamplerParams` take it (and `ctx.sample`,
 * without `grammar`). Invalid values are errors (`ERR_INVALID_ARG`), never silently clamped.
 *
 * Order: logit bias + steer → grammar → penalties → DRY → top-n-sigma → top-k → typical → top-p →
 * min-p → XTC → greedy | temperature + dist | temperature + mirostat.
 */
export interface SamplingParams {
  /** Default 0.8. `<= 0` = greedy (argmax), unless mirostat is enabled. */
  temperature?: number
  /** Integer >= 0; 0 = off. Default 40. */
  topK?: number
  /** In (0, 1]; 1 = off. Default 0.95. */
  topP?: number
  /** In [0, 1]; 0 = off. Default 0.05. */
  minP?: number
  /** RNG seed, integer in [0, 2^32). `-1` or absent = random. */
  seed?: number
  /** GBNF grammar (root rule `root`) constraining the branch's tokens. */
  grammar?: string
  /** Repetition penalties; off when absent. */
  penalties?: PenaltyParams
  /** Less common samplers (typical, Mirostat, DRY, XTC, top-n-sigma); each off when absent. */
  advanced?: AdvancedSamplingParams
  /** Static per-token biases (kept by forks). */
  logitBias?: Array<TokenBias>
}

/**
 * Runs llama.cpp's RPC server on this process's devices (its GPUs, else the CPU) on a thread of
 * its own, for the rest of the process: it cannot be stopped, and it does not keep Node's event
 * loop alive. The protocol has no authentication: anything but a loopback host needs
 * `allowRemote: true`.
 */
export declare function serveRpc(options: ServeRpcOptions): RpcServerInfo

export interface ServeRpcOptions {
  /** Address to bind. Default `'127.0.0.1'`; anything but loopback needs `allowRemote`. */
  host?: string
  port: number
  /** CPU threads for the server's computations. Default: all cores. */
  threads?: number
  /** Folder where the server caches tensors by hash, so clients reload faster. */
  cacheDir?: string
  /** Allow a non-loopback `host`. The RPC protocol has NO authentication or encryption. */
  allowRemote?: boolean
}

export declare function setLogLevel(level: string): void

/**
 * What identifies the states this context writes (its fingerprint), for the prefix cache's file
 * names: two contexts with equal identities read each other's files.
 */
export interface StateIdentity {
  /** The model's hash (size, parameters, every GGUF metadata pair), 16 hex digits. */
  model: string
  /** llama.cpp's sequence state format version. */
  stateFormat: number
  /** The KV settings that change a state's bytes (`typeK=… typeV=… flashAttention=…`). */
  kv: string
}

export declare function systemInfo(): string

/** A static or dynamic logit bias. `bias` is added to the token's logit; `-Infinity` bans it. */
export interface TokenBias {
  token: number
  bias: number
}

/** A token's log-probability at the branch's position, and the most likely tokens there. */
export interface TokenLogprob {
  token: number
  /**
   * Natural log of the token's probability under the model's distribution (raw logits,
   * before any sampler or grammar); `-Infinity` for a token the model rules out.
   */
  logprob: number
  /** The `top` most likely tokens, most likely first. */
  top: Array<TopLogprob>
}

/** One of the most likely tokens at a position, with its log-probability. */
export interface TopLogprob {
  token: number
  /** Natural log of its probability under the model's distribution (before sampling). */
  logprob: number
}

/** What `BranchStore.restoreTree` resolves. */
export interface TreeRestored {
  /** Handles of the restored branches, in the saved order. */
  handles: Array<number>
  /** Each branch's parent as an index into `handles` (-1 for the root). */
  parents: Array<number>
  /** The `meta` text saved with the tree ('' when none). */
  meta: string
  /** Size of the file. */
  bytes: number
}

/** What `store.saveTree` resolves (sizes in bytes). */
export interface TreeSaved {
  /** Handles of the saved branches, root first, parents before children. */
  handles: Array<number>
  /** Size of the file. */
  bytes: number
  /** Bytes of KV cells in it (each shared prefix once). */
  kvBytes: number
  /** Bytes of logits snapshots in it (a fork that has not moved shares its parent's). */
  logitsBytes: number
  /** Branches saved with their parent's prefix left out. */
  sharedBranches: number
}

/** What a speculative step kept of one branch's draft. */
export interface VerifiedDraft {
  /** The draft tokens the branch accepted (a prefix of its draft), after its token. */
  accepted: Array<Produced>
  /**
   * The token sampled where the draft and the branch parted (or past the whole draft): the
   * branch's next token, to commit next instead of sampling again. `null` for an empty
   * draft (a plain commit: sample next as usual) and when every candidate is masked.
   */
  next?: Produced
}

/** XTC ("exclude top choices"). Enabled when `probability` > 0. */
export interface XtcParams {
  /** In [0, 1]. Default 0.5. */
  probability?: number
  /** In [0, 1]. Default 0.1. */
  threshold?: number
}
