'use strict';

/**
 * `SessionContext`: what `createContext` returns. It holds the native context (src/napi/context.rs,
 * a `#[napi]` class whose worker thread orders every operation) privately and writes each public
 * method once, with the argument checks only JavaScript can make, AbortSignal plumbing and error
 * mapping. Nothing patches the native prototype: the native object is reached through a guarded
 * view (`nativeOf`) whose methods finish napi-rs conversion errors as ERR_INVALID_ARG.
 *
 * The context also keeps the JS-side bookkeeping of its Branch wrappers, so that every wrapper of
 * a freed branch reports `disposed`; a branch garbage-collected without prune is handed to the
 * worker (`_branchRelease`) and freed in call order.
 */

const { makeError, guardedView } = require('./errors');
const { markImages, messagesHaveImages } = require('./chat-images');
const { runCancellable } = require('./cancel');
const { jsonSchemaToGrammar, jsonSchemaToGrammarSync } = require('./schema');
const { startTrace, traceFreed } = require('./trace');
const { Warmup } = require('./warmup');

/** @typedef {import('./native').SessionContext} NativeContext */

/** Only `wrapContext` may construct a SessionContext. */
const CONSTRUCT = Symbol('SessionContext.construct');

// Set by SessionContext's static block: the only ways into its private fields.
/** @type {(ctx: SessionContext) => NativeContext} */
let nativeOfContext;
/** @type {(ctx: SessionContext) => Map<number, WrapperNode>} */
let wrappersOfContext;
/** @type {(ctx: any) => boolean} */
let isContext;
/** @type {(inner: NativeContext, warmup: boolean | 'auto' | import('./types').WarmupOptions) => SessionContext} */
let construct;

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
 *
 * Synchronous methods marked "waits" first wait for the operations queued before them, blocking
 * the event loop meanwhile (`ctx.decode(tokens, 0); ctx.getLogits()` reads that decode's row).
 * The properties and the other synchronous methods never wait.
 */
class SessionContext {
  /** @type {NativeContext} the guarded view of the native context */
  #native;
  /** @type {Map<number, WrapperNode>} Branch wrappers by handle, with the tree as JS last saw it */
  #wrappers = new Map();
  /** @type {Warmup} */
  #warmup;

  /**
   * @private
   * @param {symbol} token
   * @param {NativeContext} inner
   * @param {boolean | 'auto' | import('./types').WarmupOptions} warmup
   */
  constructor(token, inner, warmup) {
    if (token !== CONSTRUCT)
      throw makeError('ERR_INVALID_ARG', 'SessionContext cannot be constructed directly; use createContext(options)');
    this.#native = guardedView(inner);
    this.#warmup = new Warmup(this.#native, warmup);
  }

  /**
   * Resolves when the context's warm-up is over (at once when it has none): from then on the
   * first decode of each batch size runs without compiling GPU pipelines. Never rejects; the
   * status says how it ended. Operations may be queued before it resolves (they run between
   * the warm-up's decodes, and may then meet a compile themselves).
   * @returns {Promise<import('./types').WarmupStatus>}
   */
  get ready() {
    return this.#warmup.ready;
  }
  /**
   * Where the warm-up stands (option `warmup` of createContext; on by default on a GPU).
   * @returns {import('./types').WarmupStatus}
   */
  get warmup() {
    return this.#warmup.status;
  }

  /** Number of tokens in the vocabulary (the length of every logits row). */
  get vocabSize() {
    return this.#native.vocabSize;
  }
  /** Size of the model's tensors in bytes. */
  get memorySize() {
    return this.#native.memorySize;
  }
  /** Effective KV cache size in cells. */
  get nCtx() {
    return this.#native.nCtx;
  }
  /** Effective maximum tokens per decode. */
  get nBatch() {
    return this.#native.nBatch;
  }
  /** Number of KV sequences (branch leases). */
  get nSeqMax() {
    return this.#native.nSeqMax;
  }
  /** Logits rows one decode may return (option `nOutputs`): a speculative step needs one per verified token. */
  get nOutputs() {
    return this.#native.nOutputs;
  }
  /**
   * Element type of the KV cache's keys (option `typeK`).
   * @returns {'f16' | 'q8_0' | 'q4_0'}
   */
  get typeK() {
    return this.#native.typeK;
  }
  /**
   * Element type of the KV cache's values (option `typeV`).
   * @returns {'f16' | 'q8_0' | 'q4_0'}
   */
  get typeV() {
    return this.#native.typeV;
  }
  /**
   * Flash attention as asked (option `flashAttention`), or `'on'` where a quantized `typeV`
   * forces it; `'auto'` leaves the choice to llama.cpp at creation.
   * @returns {'auto' | 'on' | 'off'}
   */
  get flashAttention() {
    return this.#native.flashAttention;
  }
  /**
   * Whether the context was created with `deterministic: true`: bitwise-reproducible logits
   * whatever the batch, the fork, the cache or the restart (docs/determinism.md).
   * @returns {boolean}
   */
  get deterministic() {
    return this.#native.deterministic;
  }
  /** True after {@link dispose}. Never throws. */
  get disposed() {
    return this.#native.disposed;
  }
  /**
   * Where the model's layers went.
   * @returns {import('./types').OffloadInfo}
   */
  get offload() {
    return this.#native.offload;
  }
  /** True once an RPC server the context uses died: every call then fails with `ERR_CONTEXT_LOST`. */
  get lost() {
    return this.#native.lost;
  }
  /** llama.cpp's one-line model description, e.g. `"gemma3 270M Q4_K - Medium"`. */
  get modelDescription() {
    return this.#native.modelDescription;
  }
  /**
   * The model's sliding-window attention span in positions (0 when it has none; Gemma 3: 512).
   * {@link Branch.forkAt} below a branch's own position is refused once the branch is past it.
   */
  get slidingWindow() {
    return this.#native.slidingWindow;
  }

  /**
   * Frees the context. Idempotent. A running operation finishes first; queued ones reject with
   * `ERR_CONTEXT_DISPOSED`, as does every later call (except `disposed` and `dispose`).
   * @returns {void}
   */
  dispose() {
    this.#native.dispose();
  }

  /**
   * Traces this context's branches: `listener(event)` hears of every branch created or forked,
   * every prefill (`append`), commit (`token`) and prune from now on, in the trace format of
   * docs/events.md, which the page of `llama-branch serve` replays (the examples write these
   * events with `--jsonl`). Returns the trace: `finish(branch, reason)` marks a branch finished
   * (shown as a result rather than pruned when freed later), `idOf(branch)`, `stop()`. One trace
   * per context; a new one replaces the last. Costs nothing when none is on.
   * @param {(event: import('./types').TraceEvent) => void} listener
   * @returns {import('./types').BranchTrace}
   */
  trace(listener) {
    if (typeof listener !== 'function')
      throw makeError('ERR_INVALID_ARG', 'trace(listener): listener must be a function');
    if (this.#native.disposed) this.#native._throwCoded('ERR_CONTEXT_DISPOSED');
    return startTrace(this, listener);
  }

  // --- Tokens -------------------------------------------------------------------------------

  /**
   * Tokenizes `text` on the worker thread. Special tokens written in the text (e.g.
   * `<start_of_turn>`) are parsed as the control tokens they spell, unless `parseSpecial` is
   * false (then they are plain text). The Scheduler and the server tokenize client text
   * without parsing them (its `parseSpecial` option).
   * @param {string} text
   * @param {boolean} [addSpecial] add the model's BOS (and other special prefix) tokens. Default true.
   * @param {boolean} [parseSpecial] parse special-token text as control tokens. Default true.
   * @returns {Promise<number[]>}
   */
  tokenize(text, addSpecial, parseSpecial) {
    return this.#native.tokenize(text, addSpecial, parseSpecial);
  }
  /**
   * Tokenizes a prompt of text and images on the worker thread, with the image projector loaded
   * by `createContext({ mmprojPath })`: each image is read (bytes, or a file path; never a URL),
   * checked against `imageMaxBytes` / `imageMaxPixels`, decoded and preprocessed, and wrapped in
   * the markers the model expects (Gemma 3: `<start_of_image>` … `<end_of_image>`). Images are
   * encoded later, when the prompt is prefilled (`branch.prefill(prompt)`). Special tokens in the
   * text are parsed. Rejects with `ERR_NO_PROJECTOR` without a projector, `ERR_IMAGE_FORMAT`,
   * `ERR_IMAGE_DECODE` or `ERR_IMAGE_TOO_LARGE` for a bad image.
   * @param {import('./types').PromptPart[]} parts strings, `{ text }`, `{ image: Uint8Array }` or `{ imagePath }`
   * @param {boolean} [addSpecial] add the model's BOS. Default true.
   * @returns {Promise<MediaPrompt>}
   */
  tokenizeParts(parts, addSpecial) {
    if (!Array.isArray(parts))
      return Promise.reject(makeError('ERR_INVALID_ARG', 'tokenizeParts(parts): parts must be an array'));
    /** @type {import('./native').PromptPartInput[]} */
    const input = [];
    for (const [i, p] of parts.entries()) {
      if (typeof p === 'string') input.push({ text: p });
      else if (p instanceof Uint8Array) input.push({ image: p });
      else if (p !== null && typeof p === 'object') {
        const part = /** @type {any} */ (p);
        if (part.image !== undefined && !(part.image instanceof Uint8Array))
          return Promise.reject(
            makeError(
              'ERR_INVALID_ARG',
              `tokenizeParts: part ${i}'s image must be a Uint8Array or Buffer of file bytes`,
            ),
          );
        input.push({ text: part.text, image: part.image, imagePath: part.imagePath });
      } else
        return Promise.reject(
          makeError(
            'ERR_INVALID_ARG',
            `tokenizeParts: part ${i} must be a string, { text }, { image } or { imagePath }`,
          ),
        );
    }
    return this.#native._tokenizeParts(input, addSpecial).then((inner) => makePrompt(inner));
  }
  /** Whether the context loaded an image projector (option `mmprojPath`). */
  get hasProjector() {
    return this.#native.hasProjector;
  }
  /**
   * The image encoder's counters: images tokenized, encoder runs (one per image prefilled; a
   * fork after an image runs none) and their total time. Never waits.
   * @returns {import('./types').ImageStats}
   */
  imageStats() {
    return this.#native.imageStats();
  }
  /**
   * Synchronous {@link tokenize}. Never waits.
   * @param {string} text
   * @param {boolean} [addSpecial]
   * @param {boolean} [parseSpecial]
   * @returns {number[]}
   */
  tokenizeSync(text, addSpecial, parseSpecial) {
    return this.#native.tokenizeSync(text, addSpecial, parseSpecial);
  }
  /**
   * Turns token ids back into text, on the worker thread.
   * @param {number[]} tokens
   * @returns {Promise<string>}
   */
  detokenize(tokens) {
    return this.#native.detokenize(tokens);
  }
  /**
   * The text piece of one token. Never waits.
   * @param {number} token
   * @returns {string}
   */
  tokenToText(token) {
    return this.#native.tokenToText(token);
  }
  /**
   * Whether `token` ends generation (EOS, EOT, ...). Never waits.
   * @param {number} token
   * @returns {boolean}
   */
  isStopToken(token) {
    return this.#native.isStopToken(token);
  }
  /**
   * The end-of-generation token (EOT, else EOS). Throws `ERR_UNSUPPORTED` if the model has neither.
   * @returns {number}
   */
  getEogToken() {
    return this.#native.getEogToken();
  }
  /**
   * The BOS token, or null if the model has none.
   * @returns {number | null}
   */
  getBosToken() {
    return this.#native.getBosToken();
  }

  // --- Raw decoding and logits ----------------------------------------------------------------

  /**
   * Raw decode of `tokens` into sequence `seqId` (default 0) starting at `position`, chunked by
   * `nBatch`; logits are computed for the last token. `position` must continue the sequence
   * (`kvSeqPosMax(seqId) + 1`, or 0 for an empty one). Refused (`ERR_INVALID_ARG`) on a sequence
   * leased by a live branch. Rejects with `ERR_KV_FULL` past `nCtx` or when llama.cpp finds no
   * free KV cells, and with `ERR_DECODE` when `llama_decode` fails otherwise; on failure the
   * cells written by this call are removed again. Rejects with `ERR_ABORTED` when
   * `options.signal` aborts it (the sequence then holds none of these tokens).
   * `decode(tokens, position, options)` is sequence 0 with options.
   * @param {number[]} tokens
   * @param {number} position
   * @param {number | import('./types').OperationOptions} [seqId]
   * @param {import('./types').OperationOptions} [options]
   * @returns {Promise<void>}
   */
  decode(tokens, position, seqId, options) {
    if (seqId !== null && typeof seqId === 'object' && options === undefined) {
      options = seqId;
      seqId = undefined;
    }
    const native = this.#native;
    const seq = /** @type {number | undefined} */ (seqId);
    try {
      return runCancellable(options, 'decode', (cancel) => native.decode(tokens, position, seq, cancel));
    } catch (e) {
      return Promise.reject(e);
    }
  }
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
   * Throws `ERR_NO_LOGITS` before the first decode. Waits for queued operations.
   * @returns {Float32Array}
   */
  getLogits() {
    return this.#native.getLogits();
  }
  /**
   * Argmax of the context's last logits row (ties: the lowest id). Sees writes through
   * {@link getLogits}. Waits for queued operations.
   * @returns {number}
   */
  greedySample() {
    return this.#native.greedySample();
  }
  /**
   * Raw decode (as {@link decode}; `seqId` is required) that then copies the last token's logits
   * into `dest`, a `Float32Array` or `ArrayBuffer` of at least `vocabSize` floats. `dest` is
   * checked before anything is decoded (`ERR_INVALID_ARG`); the copy is independent of the
   * context and is taken right after the decode, before any later queued operation runs.
   * @param {number[]} tokens
   * @param {number} position
   * @param {number} seqId
   * @param {Float32Array | ArrayBuffer} dest
   * @returns {Promise<void>}
   */
  async decodeAndCapture(tokens, position, seqId, dest) {
    const n = this.vocabSize;
    captureTarget(dest, n);
    // One native job decodes and copies, so no later operation can slip in between.
    const row = await this.#native._decodeAndCapture(tokens, position, seqId);
    // Checked again: the caller may have transferred or detached `dest` while the decode ran.
    captureTarget(dest, n).set(row);
  }
  /**
   * Entropy of the softmax of `logits` (default: the context's last logits row). Non-finite
   * logits (masked tokens) are left out. A given `logits` must be a Float32Array of length
   * `vocabSize` (else `ERR_INVALID_ARG`). Without `logits`, waits for queued operations.
   * @param {import('./types').EntropyBase} [base] `'nats'` (default) or `'bits'`.
   * @param {Float32Array} [logits]
   * @returns {number}
   */
  modelEntropy(base, logits) {
    return this.#native.modelEntropy(base, logits);
  }
  /**
   * Surprisal `-log p(token)` under `logits` (default: the context's last logits row); `Infinity`
   * for a masked token. `token` outside the vocabulary throws `ERR_TOKEN_OUT_OF_RANGE`; a given
   * `logits` must be a Float32Array of length `vocabSize` (else `ERR_INVALID_ARG`). Without
   * `logits`, waits for queued operations.
   * @param {number} token
   * @param {import('./types').EntropyBase} [base] `'nats'` (default) or `'bits'`.
   * @param {Float32Array} [logits]
   * @returns {number}
   */
  modelSurprisal(token, base, logits) {
    return this.#native.modelSurprisal(token, base, logits);
  }

  // --- KV cache -------------------------------------------------------------------------------

  /**
   * Highest position stored for the sequence, or -1 when it is empty. Waits for queued operations.
   * @param {number} seqId
   * @returns {number}
   */
  kvSeqPosMax(seqId) {
    return this.#native.kvSeqPosMax(seqId);
  }
  /**
   * Same as `kvSeqPosMax(seqId)` (default sequence 0): the highest position, or -1 when empty.
   * Note: this is not a cell count (a sequence holding 3 tokens returns 2). Waits for queued
   * operations.
   * @param {number} [seqId]
   * @returns {number}
   */
  kvCacheSize(seqId) {
    return this.#native.kvCacheSize(seqId);
  }
  /**
   * Empties the whole KV cache. Rejects with `ERR_INVALID_ARG` while any branch is alive.
   * @returns {Promise<void>}
   */
  kvCacheClear() {
    return this.#native.kvCacheClear();
  }
  /**
   * Removes positions `[start, end)` of a sequence no live branch leases (`-1` means "from the
   * start" / "to the end"). Rejects with `ERR_STATE` if the model's memory cannot remove a
   * partial range.
   * @param {number} seqId
   * @param {number} start
   * @param {number} end
   * @returns {Promise<void>}
   */
  kvCacheRemove(seqId, start, end) {
    return this.#native.kvCacheRemove(seqId, start, end);
  }
  /**
   * Makes `dst` hold sequence `src`'s cells at positions `[p0, p1)` (default: all; `-1` means
   * "from the start" / "to the end"). Cells are shared, not duplicated. `dst` is cleared first,
   * must differ from `src` and must not be leased by a live branch. Waits for queued operations.
   * @param {number} src
   * @param {number} dst
   * @param {number} [p0]
   * @param {number} [p1]
   * @returns {void}
   */
  kvSeqCopy(src, dst, p0, p1) {
    this.#native.kvSeqCopy(src, dst, p0, p1);
  }
  /**
   * Removes the cells of every sequence except `seqId`. Throws `ERR_INVALID_ARG` while a live
   * branch holds another sequence (use `store.retainOnly` to keep one branch). Waits for queued
   * operations.
   * @param {number} seqId
   * @returns {void}
   */
  kvSeqKeep(seqId) {
    this.#native.kvSeqKeep(seqId);
  }
  /**
   * Clears the whole KV cache, then decodes `sinks` at position 0 and `tail` right after them
   * into sequence 0 (logits for the last token; the next position is `sinks.length +
   * tail.length`): StreamingLLM-style reseeding, keeping the first tokens (attention sinks) and
   * a recent tail of a long generation. Rejects with `ERR_INVALID_ARG` when both are empty or
   * while any branch is alive, with `ERR_KV_FULL` when they exceed `nCtx` (checked before
   * clearing).
   * @param {number[]} sinks
   * @param {number[]} tail
   * @returns {Promise<void>}
   */
  clearAndReseed(sinks, tail) {
    return this.#native.clearAndReseed(sinks, tail);
  }
  /**
   * The state (KV cells) of sequence `seqId` (default 0) as a Buffer for {@link kvCacheLoad}:
   * loading it back into a context of the same model and settings restores the same next-token
   * logits. Works on leased sequences too. Rejects with `ERR_INVALID_ARG` if the sequence is empty.
   * @param {number} [seqId]
   * @returns {Promise<Buffer>}
   */
  kvCacheSave(seqId) {
    return this.#native.kvCacheSave(seqId);
  }
  /**
   * Replaces sequence `seqId`'s cells with a state from {@link kvCacheSave} (the buffer is copied
   * at call time). Rejects with `ERR_INVALID_ARG` for an empty buffer or a leased sequence, and
   * with `ERR_STATE` when the data is not a state, is truncated, has trailing bytes, comes from
   * another model or configuration, or does not fit in the free cells; the sequence then keeps
   * its previous cells. (Corrupted tensor bytes inside a well-formed state cannot be detected.)
   * @param {number} seqId
   * @param {Buffer | Uint8Array} state
   * @returns {Promise<void>}
   */
  kvCacheLoad(seqId, state) {
    return this.#native.kvCacheLoad(seqId, state);
  }
  /**
   * Writes sequence `seqId`'s state and `tokens` (usually the tokens it holds, for your own
   * bookkeeping) to the file `path`, replacing it. Resolves the bytes written. Rejects with
   * `ERR_INVALID_ARG` for an empty sequence, an empty or unwritable path, or more than `nCtx`
   * tokens.
   * @param {number} seqId
   * @param {string} path
   * @param {number[]} tokens
   * @returns {Promise<number>}
   */
  kvCacheWriteFile(seqId, path, tokens) {
    return this.#native.kvCacheWriteFile(seqId, path, tokens);
  }
  /**
   * Loads a file written by {@link kvCacheWriteFile} into sequence `seqId` (replacing its cells)
   * and resolves the stored tokens and the file size. Rejects with `ERR_INVALID_ARG` when the
   * file cannot be opened or the sequence is leased, and with `ERR_STATE` when the file is not a
   * valid state file for this model and context; the sequence then keeps its previous cells.
   * @param {number} seqId
   * @param {string} path
   * @returns {Promise<import('./types').KvFileContents>}
   */
  kvCacheReadFile(seqId, path) {
    return this.#native.kvCacheReadFile(seqId, path);
  }

  // --- Chat (the model's Jinja chat template, rendered and parsed by llama.cpp's chat layer) ---

  /**
   * Renders `messages` (OpenAI-style, as JSON text or as an array) with the model's chat template,
   * or with `options.templateOverride` (a string second argument is also taken as the override).
   * A model without a template gets Gemma's template when its vocabulary has Gemma's turn tokens,
   * llama.cpp's ChatML otherwise. The prompt carries no BOS text: tokenize it with the default
   * `addSpecial` for the first turn.
   *
   * A leading `{role: 'system', content: ''}` message means "only this turn": the rest of the
   * messages are rendered exactly as they appear after an earlier exchange, ready to append to a
   * conversation in the KV cache after {@link SessionContext.getTurnSeparator} (see docs/api.md, Chat).
   *
   * Messages (as an array) whose content holds image parts, `{ type: 'image', image: Uint8Array }`
   * or `{ type: 'image', imagePath }` beside `{ type: 'text', text }`, are rendered with each image
   * in its place: the result's `parts` is the prompt as prompt parts (strings and images in order)
   * for {@link SessionContext.tokenizeParts}, and its `prompt` shows each image as `<__media__>`
   * (docs/images.md). Images are neither read nor checked here: `tokenizeParts` does that.
   *
   * Runs on the context's worker. Rejects with `ERR_INVALID_ARG` (messages, tools, toolChoice or
   * reasoningFormat malformed, or a content part beside images that is neither text nor an image,
   * named by its path `messages[i].content[k]`) or `ERR_CHAT_TEMPLATE` (the template fails to
   * parse or render, e.g. roles that do not alternate); it never falls back to another prompt format.
   * @param {string | readonly import('./types').ChatMessage[]} messages
   * @param {import('./types').FormatChatOptions | string} [options]
   * @returns {Promise<import('./types').FormattedChatResult>}
   */
  formatChat(messages, options) {
    if (!messagesHaveImages(messages)) return this.#native.formatChat(messages, options);
    let images;
    try {
      images = markImages(/** @type {any[]} */ (messages), 'messages', 'formatChat: ');
    } catch (e) {
      return Promise.reject(e);
    }
    return this.#native.formatChat(images.messages, options).then((r) => withImages(r, images));
  }
  /**
   * {@link formatChat} on the calling thread (the template renders while JavaScript waits).
   * Never waits for queued operations: it uses the model only. Throws what `formatChat` rejects with.
   * @param {string | readonly import('./types').ChatMessage[]} messages
   * @param {import('./types').FormatChatOptions | string} [options]
   * @returns {import('./types').FormattedChatResult}
   */
  formatChatSync(messages, options) {
    if (!messagesHaveImages(messages)) return this.#native.formatChatSync(messages, options);
    const images = markImages(/** @type {any[]} */ (messages), 'messages', 'formatChatSync: ');
    return withImages(this.#native.formatChatSync(images.messages, options), images);
  }
  /**
   * The module's {@link jsonSchemaToGrammar} as a member (it uses no context state).
   * @param {string | object} schema
   * @returns {Promise<string>}
   */
  jsonSchemaToGrammar(schema) {
    return jsonSchemaToGrammar(schema);
  }
  /**
   * The module's {@link jsonSchemaToGrammarSync} as a member.
   * @param {string | object} schema
   * @returns {string}
   */
  jsonSchemaToGrammarSync(schema) {
    return jsonSchemaToGrammarSync(schema);
  }
  /**
   * Splits model output into content, reasoning and tool calls with the parser `formatChat`
   * built. Pass `format` and the formatChat result (or at least its `parser` and
   * `generationPrompt`) as options; without a `parser` the whole output is content.
   * Throws `ERR_CHAT_PARSE` when the output does not match the format (`isPartial: true` accepts
   * an unfinished output while streaming), `ERR_INVALID_ARG` for malformed options.
   * Synchronous; never waits (usable while the context is busy).
   * @param {string} output
   * @param {import('./types').ChatFormat} format
   * @param {import('./types').ParseChatOutputOptions} [options]
   * @returns {import('./types').ParseChatOutputResult}
   */
  parseChatOutput(output, format, options) {
    return this.#native.parseChatOutput(output, format, options);
  }
  /**
   * Whether `template` is a Jinja chat template llama.cpp can parse and render (runs on the worker).
   * @param {string} template
   * @returns {Promise<boolean>}
   */
  validateChatTemplate(template) {
    return this.#native.validateChatTemplate(template);
  }
  /**
   * Tokens that close an assistant turn before the next message: the template's text between an
   * assistant message and the next user message, tokenized, up to its first end-of-generation
   * token plus trailing whitespace tokens (Gemma: `<end_of_turn>`, `"\n"`; ChatML:
   * `<|im_end|>`, `"\n"`). Falls back to `[EOT or EOS]` when the template yields nothing usable.
   * Computed once per context. Never waits (usable while the context is busy).
   * @returns {number[]}
   */
  getTurnSeparator() {
    return this.#native.getTurnSeparator();
  }

  // --- Sampling from the context's logits ---------------------------------------------------

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
   * `ERR_GRAMMAR` if `logitBias` bans every token. Waits for queued operations.
   * @param {import('./types').SamplingParams | null} [params]
   * @returns {number}
   */
  sample(params) {
    return this.#native.sample(params);
  }

  // --- Grammar sampler handles ----------------------------------------------------------------

  /**
   * Parses a GBNF grammar (root rule `root`) into a grammar sampler and returns its handle (a
   * positive integer, valid on this context only). Throws `ERR_GRAMMAR` for an empty or
   * malformed grammar. Handles are freed by {@link freeSamplerHandle} or {@link dispose}.
   * @param {string} grammar
   * @returns {number}
   */
  createSampler(grammar) {
    return this.#native.createSampler(grammar);
  }
  /**
   * Masks `logits` in place: every token the grammar forbids in its current state becomes
   * `-Infinity`; allowed entries are unchanged. `logits` must be a Float32Array of length
   * `vocabSize` (else `ERR_INVALID_ARG`). Waits for queued operations.
   * @param {number} handle
   * @param {Float32Array} logits
   * @returns {void}
   */
  applySampler(handle, logits) {
    this.#native.applySampler(handle, logits);
  }
  /**
   * Advances the grammar by `token`. A token the grammar forbids (including end-of-generation
   * before the grammar is complete) throws `ERR_GRAMMAR_REJECTED` and leaves the grammar as it
   * was.
   * @param {number} handle
   * @param {number} token
   * @returns {void}
   */
  acceptSamplerToken(handle, token) {
    this.#native.acceptSamplerToken(handle, token);
  }
  /**
   * A new handle with a copy of the grammar's current parse state.
   * @param {number} handle
   * @returns {number}
   */
  cloneSampler(handle) {
    return this.#native.cloneSampler(handle);
  }
  /**
   * Frees a grammar sampler. An unknown or already freed handle throws `ERR_INVALID_ARG` (as
   * for every handle method; perplexity trackers behave the same way).
   * @param {number} handle
   * @returns {void}
   */
  freeSamplerHandle(handle) {
    this.#native.freeSamplerHandle(handle);
  }

  // --- Perplexity trackers (work at any time, even while the context is busy) ---------------

  /**
   * A new tracker (count 0) and its handle. Freed by {@link freePerplexityTracker} or {@link dispose}.
   * @returns {number}
   */
  createPerplexityTracker() {
    return this.#native.createPerplexityTracker();
  }
  /**
   * Adds one surprisal, in nats (e.g. `modelSurprisal(token)`). Non-finite values (a token the
   * distribution excluded) are ignored and not counted; negative values count as 0.
   * @param {number} handle
   * @param {number} surprisal
   * @returns {void}
   */
  addSurprisal(handle, surprisal) {
    this.#native.addSurprisal(handle, surprisal);
  }
  /**
   * `exp(mean surprisal)`; `Infinity` while the count is 0.
   * @param {number} handle
   * @returns {number}
   */
  getPerplexity(handle) {
    return this.#native.getPerplexity(handle);
  }
  /**
   * Number of surprisals counted.
   * @param {number} handle
   * @returns {number}
   */
  getPerplexityCount(handle) {
    return this.#native.getPerplexityCount(handle);
  }
  /**
   * Sets the count and sum back to 0.
   * @param {number} handle
   * @returns {void}
   */
  resetPerplexityTracker(handle) {
    this.#native.resetPerplexityTracker(handle);
  }
  /**
   * A new, independent tracker with the same count and sum.
   * @param {number} handle
   * @returns {number}
   */
  clonePerplexityTracker(handle) {
    return this.#native.clonePerplexityTracker(handle);
  }
  /**
   * Frees a tracker. Unknown or already freed handles throw `ERR_INVALID_ARG`, as do all tracker methods.
   * @param {number} handle
   * @returns {void}
   */
  freePerplexityTracker(handle) {
    this.#native.freePerplexityTracker(handle);
  }

  // --- Embeddings (contexts created with `embeddings: true`) --------------------------------

  /**
   * Computes embeddings for `tokens` (at most `nBatch`, one decode, nothing truncated): sequence
   * 0 is **cleared first**, then the tokens go to positions `0..n-1` of it, so successive calls
   * are independent. Rejects with `ERR_UNSUPPORTED` on a context without `embeddings: true`,
   * `ERR_INVALID_ARG` for an empty or too long input or when a live branch leases sequence 0.
   * @param {number[]} tokens
   * @returns {Promise<void>}
   */
  encode(tokens) {
    return this.#native.encode(tokens);
  }
  /**
   * Embeds several inputs (token arrays) at once, each on a sequence of its own: as many per
   * decode as fit `nBatch` tokens and `nSeqMax` sequences (create the context with `nSeqMax` > 1
   * to batch), so N short texts cost ⌈N / nSeqMax⌉ decodes, not N. Resolves one pooled vector per
   * input, in order, L2-normalised unless `normalize` is false; sequences 0.. are cleared before
   * and after (no KV growth). Every input is checked first: `ERR_INVALID_ARG` for an empty or too
   * long one or when a live branch leases a sequence it needs, `ERR_UNSUPPORTED` without pooling
   * (`PoolingType.NONE` or `RANK`: use {@link encode}) or on a context without `embeddings: true`.
   * @param {number[][]} inputs
   * @param {boolean} [normalize]
   * @returns {Promise<Float32Array[]>}
   */
  embedBatch(inputs, normalize) {
    return this.#native.embedBatch(inputs, normalize);
  }
  /**
   * A copy of the embedding of the last {@link encode} (length {@link getEmbeddingDimension}):
   * pooled over sequence 0 (`poolingType` MEAN, CLS or LAST), or the last token's vector with
   * `PoolingType.NONE`. L2-normalised unless `normalize` is false. Throws `ERR_NO_LOGITS` before
   * the first encode, `ERR_UNSUPPORTED` on a non-embedding context or with `PoolingType.RANK`.
   * Waits for queued operations.
   * @param {boolean} [normalize]
   * @returns {Float32Array}
   */
  getEmbeddings(normalize) {
    return this.#native.getEmbeddings(normalize);
  }
  /**
   * Length of the embedding vectors (the model's embedding width). Works on any context, at any time.
   * @returns {number}
   */
  getEmbeddingDimension() {
    return this.#native.getEmbeddingDimension();
  }
  /**
   * True when the context pools token embeddings per sequence (`poolingType` not NONE). Any time.
   * @returns {boolean}
   */
  hasPooling() {
    return this.#native.hasPooling();
  }

  // --- For lib/ only (Branch, BranchStore): not public API -----------------------------------

  static {
    /** @param {SessionContext} ctx */
    nativeOfContext = (ctx) => ctx.#native;
    /** @param {SessionContext} ctx */
    wrappersOfContext = (ctx) => ctx.#wrappers;
    /** @param {any} ctx */
    isContext = (ctx) => ctx !== null && typeof ctx === 'object' && #native in ctx;
    construct = (inner, warmup) => new SessionContext(CONSTRUCT, inner, warmup);
  }
}

/** Only `makePrompt` may construct a MediaPrompt. */
const CONSTRUCT_PROMPT = Symbol('MediaPrompt.construct');
/** @type {(inner: import('./native').MediaPrompt) => MediaPrompt} */
let makePrompt;
/** @type {(prompt: any) => import('./native').MediaPrompt | null} */
let nativeOfPrompt;

/**
 * A prompt of text and images tokenized by a context's projector ({@link SessionContext.tokenizeParts}):
 * text runs as token ids and images as chunks encoded when the prompt is prefilled into a branch
 * (`branch.prefill(prompt)`). An image takes `nPos` positions of the branch's sequence; it has no
 * token ids (its piece carries the SHA-256 of its file bytes instead).
 */
class MediaPrompt {
  /** @type {import('./native').MediaPrompt} */
  #native;

  /**
   * @private
   * @param {symbol} token
   * @param {import('./native').MediaPrompt} inner
   */
  constructor(token, inner) {
    if (token !== CONSTRUCT_PROMPT)
      throw makeError('ERR_INVALID_ARG', 'MediaPrompt cannot be constructed directly; use ctx.tokenizeParts(parts)');
    this.#native = inner;
  }
  /**
   * The pieces in order: `{ type: 'text', tokens, nPos }` and `{ type: 'image', nTokens, nPos, id }`.
   * @returns {import('./native').PromptPiece[]}
   */
  get pieces() {
    return this.#native.pieces;
  }
  /** Positions the whole prompt takes in a sequence (text tokens plus each image's positions). */
  get nPos() {
    return this.#native.nPos;
  }
  /** Images in the prompt. */
  get nImages() {
    return this.#native.nImages;
  }

  static {
    makePrompt = (inner) => new MediaPrompt(CONSTRUCT_PROMPT, inner);
    nativeOfPrompt = (p) => (p !== null && typeof p === 'object' && #native in p ? p.#native : null);
  }
}

/**
 * A formatChat result of messages with images (`markImages`): its prompt showing each image as
 * `<__media__>`, and `parts`, the prompt cut into text and images.
 * @param {import('./types').FormattedChatResult} result
 * @param {ReturnType<typeof markImages>} images
 * @returns {import('./types').FormattedChatResult}
 */
function withImages(result, images) {
  const { prompt } = result;
  return { ...result, prompt: images.shown(prompt), parts: images.parts(prompt) };
}

/**
 * The facade over a native context that `createContext` made, its warm-up started.
 * @param {NativeContext} inner
 * @param {boolean | 'auto' | import('./types').WarmupOptions} [warmup] `options.warmup`, checked
 * @returns {SessionContext}
 */
function wrapContext(inner, warmup = 'auto') {
  return construct(inner, warmup);
}

/**
 * The (guarded) native context behind `ctx`: for lib/'s Branch and BranchStore, and for tests that
 * look at internals. Throws ERR_INVALID_ARG for anything else, ERR_CONTEXT_DISPOSED once disposed.
 * @param {any} ctx
 * @returns {NativeContext}
 */
function nativeOf(ctx) {
  if (!isContext(ctx)) throw makeError('ERR_INVALID_ARG', 'expected a SessionContext from createContext()');
  const native = nativeOfContext(ctx);
  if (native.disposed) native._throwCoded('ERR_CONTEXT_DISPOSED');
  return native;
}

/** `dest` as a Float32Array of exactly `n` floats, or an ERR_INVALID_ARG error. */
function captureTarget(dest, n) {
  if (dest instanceof Float32Array) {
    if (dest.length < n)
      throw makeError(
        'ERR_INVALID_ARG',
        `decodeAndCapture: dest holds ${dest.length} floats; it needs at least vocabSize = ${n}`,
      );
    return dest.subarray(0, n);
  }
  if (dest instanceof ArrayBuffer) {
    if (dest.byteLength < n * 4)
      throw makeError(
        'ERR_INVALID_ARG',
        `decodeAndCapture: dest holds ${dest.byteLength} bytes; it needs at least vocabSize * 4 = ${n * 4}`,
      );
    return new Float32Array(dest, 0, n);
  }
  throw makeError(
    'ERR_INVALID_ARG',
    'decodeAndCapture: dest must be a Float32Array or an ArrayBuffer of at least vocabSize floats',
  );
}

// --- Branch wrapper bookkeeping --------------------------------------------------------------
//
// Each context keeps its wrappers by handle together with their parent handle, mirroring the
// native branch tree as of the calls made so far (forks are synchronous; frees are recorded when
// they are called, not when the worker gets to them). So `pruneSubtree()` can mark every
// descendant disposed before it returns, even while the native free is still queued.

/**
 * @typedef {{ ref: WeakRef<object>, parent: number }} WrapperNode
 */

/** Each Branch wrapper's context and handle: what BranchStore and the speculation helpers read of it. */
const wrapperInfo = new WeakMap();
/** Wrappers whose branch was freed (by their own call, a subtree prune or a retainOnly). */
const disposedWrappers = new WeakSet();

const collected = new FinalizationRegistry(({ ctxRef, handle }) => {
  const ctx = ctxRef.deref();
  if (!ctx || ctx.disposed) return;
  unlink(wrappersOfContext(ctx), handle);
  traceFreed(ctx, [handle]);
  nativeOfContext(ctx)._branchRelease(handle);
});

/**
 * Remembers `branch` (a Branch wrapper of `handle` on `ctx`, a child of `parent` or a root for 0)
 * so a native free marks it disposed.
 * @param {SessionContext} ctx
 * @param {object} branch
 * @param {number} handle
 * @param {number} parent
 */
function registerBranch(ctx, branch, handle, parent) {
  wrapperInfo.set(branch, { ctx, handle });
  wrappersOfContext(ctx).set(handle, { ref: new WeakRef(branch), parent });
  collected.register(branch, { ctxRef: new WeakRef(ctx), handle }, branch);
}

/**
 * Forgets `handle`, re-parenting its children to its parent, as the native store does.
 * @param {Map<number, WrapperNode>} nodes
 * @param {number} handle
 */
function unlink(nodes, handle) {
  const node = nodes.get(handle);
  if (!node) return;
  for (const other of nodes.values()) if (other.parent === handle) other.parent = node.parent;
  nodes.delete(handle);
}

/**
 * Marks the wrappers of freed handles disposed (and forgets them).
 * @param {SessionContext} ctx
 * @param {number[] | undefined} handles
 */
function wrapFreed(ctx, handles) {
  const nodes = wrappersOfContext(ctx);
  for (const h of handles || []) {
    const w = nodes.get(h)?.ref.deref();
    if (w) {
      disposedWrappers.add(w);
      collected.unregister(w);
    }
    unlink(nodes, h);
  }
  // A trace hears of each free once: handles are generational, so a later call naming a handle
  // again (the native report of a free already recorded) finds nothing left to report.
  traceFreed(ctx, handles || []);
  return handles;
}

/**
 * `handle` and its descendants as JS last saw the tree (children before their parents'
 * parents do not matter: every one of them is freed).
 * @param {SessionContext} ctx
 * @param {number} handle
 * @returns {number[]}
 */
function subtreeOf(ctx, handle) {
  const nodes = wrappersOfContext(ctx);
  const children = new Map();
  for (const [h, node] of nodes) {
    if (!children.has(node.parent)) children.set(node.parent, []);
    children.get(node.parent).push(h);
  }
  const out = [];
  const stack = [handle];
  while (stack.length) {
    const h = /** @type {number} */ (stack.pop());
    out.push(h);
    stack.push(...(children.get(h) || []));
  }
  return out;
}

/**
 * The live wrapper of native branch `handle` on `ctx`, or null when it was garbage-collected
 * (its branch is being freed).
 * @param {SessionContext} ctx @param {number} handle
 */
function wrapperOf(ctx, handle) {
  return wrappersOfContext(ctx).get(handle)?.ref.deref() ?? null;
}

/** Fire-and-forget prune that never surfaces as an unhandled rejection (the branch may be gone). */
function release(branch) {
  if (branch && !branch.disposed) branch.prune().catch(() => {});
}

/** Whether the branch wrapper was freed. */
function isDisposed(branch) {
  return disposedWrappers.has(branch);
}

/** Marks the branch wrapper freed (its native free is called or queued). */
function markDisposed(branch) {
  disposedWrappers.add(branch);
}

/**
 * The handle of branch wrapper `b` for an operation on `ctx`: ERR_INVALID_ARG for anything else,
 * ERR_BRANCH_DISPOSED for a freed branch of `ctx` (a foreign one is left to the native side,
 * which names it ERR_FOREIGN_BRANCH).
 * @param {SessionContext} ctx
 * @param {unknown} b
 * @param {string} where
 */
function branchHandle(ctx, b, where) {
  const info = typeof b === 'object' && b !== null ? wrapperInfo.get(b) : undefined;
  if (!info) throw makeError('ERR_INVALID_ARG', `${where}: expected a Branch`);
  if (disposedWrappers.has(/** @type {object} */ (b)) && info.ctx === ctx)
    nativeOf(ctx)._throwCoded('ERR_BRANCH_DISPOSED');
  return info.handle;
}

/** The context a branch wrapper belongs to. */
function branchContext(b) {
  const info = wrapperInfo.get(b);
  return info && info.ctx;
}

module.exports = {
  SessionContext,
  MediaPrompt,
  nativeOfPrompt,
  wrapContext,
  nativeOf,
  registerBranch,
  wrapFreed,
  subtreeOf,
  isDisposed,
  markDisposed,
  branchHandle,
  branchContext,
  wrapperOf,
  release,
};
