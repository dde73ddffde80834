'use strict';

/**
 * Every default of the Scheduler, the server and `llama-branch serve`, defined once. The CLI
 * shows these in its help; the server and the Scheduler fall back to them.
 */

/** `new Scheduler(ctx, options)`. */
const scheduler = Object.freeze({
  /** Prompt tokens prefilled per step, over all requests. */
  prefillChunk: 256,
  /** Requests that may wait; more are refused with ERR_QUEUE_FULL. */
  maxQueue: 64,
  /** Requests generating at once. */
  maxRunning: Infinity,
  /** `maxTokens` of a request that gives none. */
  defaultMaxTokens: 256,
  /** Host RAM for evicted prefixes' states (0: no RAM tier). */
  cacheRam: 0,
  /** Disk the `cacheDir` folder may take. */
  cacheDisk: '20GiB',
  /**
   * Whether client text (prompts, messages, decision states and questions) that spells the
   * model's special tokens is parsed as those control tokens (false: plain text).
   */
  parseSpecial: false,
  /** A decode step's time budget that extra lines (forks, `n` choices) are admitted within (null: none). */
  stepBudgetMs: null,
});

/** `createServer(options)` and `llama-branch serve`. */
const server = Object.freeze({
  port: 8080,
  host: '127.0.0.1',
  /** Requests generating at once (the Scheduler's maxRunning). */
  parallel: 4,
  /** KV cells of a context the server creates. */
  nCtx: 8192,
  /** Leases per running request: n up to 4 choices, its prompt branch and a system-prompt prefix. */
  leasesPerRequest: 6,
  /** Leases kept for cached prefixes beyond the running requests' own. */
  cacheLeases: 16,
  /** The most leases a server-created context gets. */
  maxSeqMax: 256,
  /** Largest request body in bytes. */
  maxBodyBytes: 1 << 20,
  /** OpenAI's default `max_tokens` for /v1/completions; chat requests default to the Scheduler's. */
  completionsMaxTokens: 16,
  /** The largest `max_tokens` a request may ask for (a larger one is a 400). */
  maxTokensLimit: 4096,
  /** The largest `n` a request may ask for. */
  maxN: 16,
  /** Questions per POST /v1/systemone request at most (more: a 400 `too_many_questions`). */
  maxQuestions: 64,
  /** How chat replies are split into reasoning and content (llama.cpp's `--reasoning-format`). */
  reasoningFormat: 'auto',
  /** KV cells (and batch) of the embeddings context `--embeddings` creates: the longest input. */
  embeddingsCtx: 2048,
  /** Inputs the server's embeddings context embeds in one decode (its `nSeqMax`). */
  embeddingsBatch: 8,
  /** Inputs per /v1/embeddings request at most. */
  maxEmbeddingInputs: 256,
  /** `--spec-max-draft`: the longest draft one line verifies in a step. */
  specMaxDraft: 8,
  /** Choices per request a `--spec draft` context has sequences for (each needs three). */
  draftLinesPerRequest: 4,
});

/** Sequence leases of a server-created context for `parallel` running requests. */
function serverSeqMax(parallel) {
  return Math.min(server.maxSeqMax, parallel * server.leasesPerRequest + server.cacheLeases);
}

module.exports = { scheduler, server, serverSeqMax };
