'use strict';

/**
 * One `scheduler.generate()` request as a built-in program (./program.js): ONE prompt line (cut
 * into cache entries at its system prompt's end and at its own end) forked `n` times, each fork
 * running a gen. What a line does is the line's (./line.js); the request's own are its preparation
 * (chat template, tokenization), what admitting it takes, and how it settles: with n choices
 * (those still running when it is aborted or the scheduler closes end 'abort'), or rejected.
 */

const { SEED_SPACE, invalid, positiveInt, checkInput, checkStops, checkLogprobs, checkSampling } = require('./checks');
const { checkChat, formatTurn, ChatStream } = require('./chat');
const { GenJob } = require('./jobs');
const { Choice } = require('./choice');
const { Program } = require('./program');
const { Generation } = require('./generation');

class RequestProgram extends Program {
  /**
   * Checks `request` (throws ERR_INVALID_ARG); the request starts queued.
   * @param {any} request what `generate` was given
   * @param {any} env see Program, with `vocabSize`
   */
  constructor(request, env) {
    checkInput(request, env.vocabSize);
    const { params, seed, grammar } = checkSampling(request);
    const generation = new Generation();
    super(env, 'request', request.signal, generation.sink);
    /** What `generate` returns: its choices' events (`push`) and its result go there. */
    this.generation = generation;
    this.push = generation.sink.push;
    this.input = request;
    this.n = positiveInt(request.n, 'request.n', 1);
    this.maxTokens = positiveInt(request.maxTokens, 'request.maxTokens', env.defaultMaxTokens);
    this.stops = checkStops(request.stop);
    /** Top alternatives per token when log-probabilities were asked for, else undefined. */
    this.logprobs = checkLogprobs(request.logprobs, 'request.logprobs');
    this.params = params;
    this.seedBase = seed === undefined || seed === -1 ? Math.floor(Math.random() * SEED_SPACE) : seed;
    this.grammar = grammar;
    /** Lazy-grammar triggers of a tool-call grammar (null: the grammar applies from the start). */
    this.grammarLazy = null;
    /** formatChat's options (tools, toolChoice, reasoning), and the ChatTurn once prepared. */
    this.chatOptions = checkChat(request);
    this.chat = null;
    /** The prefixes a client with a cache key caches are kept warm longer (./prefix-cache.js). */
    this.cacheKey = request.cacheKey === undefined ? null : request.cacheKey;
    /** Admitted without waiting for a restore from the RAM or disk tier (with one, it never fits). */
    this.tierSkip = false;
    /** Converted off the main thread from now on; awaited when the request is prepared. */
    this.grammarPending = request.jsonSchema !== undefined ? env.jsonSchemaToGrammar(request.jsonSchema) : null;
    if (this.grammarPending) this.grammarPending.catch(() => {}); // reported when prepared
    /** Once prepared: the prompt's tokens, and where it is cut into cache entries. */
    this.tokens = [];
    this.cachePoints = [];
    /** Once admitted: the cache start planned, its entry (see begin), the prompt line. */
    this.plannedStart = 0;
    this.plannedEntry = null;
    this.prompt = null;
    /** @type {Choice[]} */
    this.choices = [];
  }

  /**
   * Tokenizes the prompt (messages: the chat template, on the context's worker), finds where it
   * is cut into cache entries, resolves the grammar and checks that the request fits the context.
   * @param {import('../Context').SessionContext} ctx
   * @param {import('./system-prompts').SystemPrompts} systemPrompts
   */
  async prepare(ctx, systemPrompts) {
    const { prompt, tokens, messages } = this.input;
    if (messages !== undefined) {
      this.chat = await formatTurn(ctx, messages, this.chatOptions);
      const { formatted } = this.chat;
      this.tokens = ctx.tokenizeSync(formatted.prompt, true);
      this.stops.push(...formatted.stopTokens.filter((s) => s !== ''));
      if (this.chat.grammar) {
        if (this.grammar || this.grammarPending) throw invalid('give tools or a grammar / jsonSchema, not both');
        this.grammar = this.chat.grammar;
        this.grammarLazy = this.chat.lazy;
      }
      const lead = await systemPrompts.prefixOf(messages);
      if (lead && lead.length < this.tokens.length && lead.every((t, i) => t === this.tokens[i]))
        this.cachePoints.push(lead.length);
    } else {
      this.tokens = tokens !== undefined ? tokens.slice() : ctx.tokenizeSync(prompt, true);
    }
    if (this.tokens.length === 0) throw invalid('the prompt tokenized to nothing; give a non-empty prompt');
    this.cachePoints.push(this.tokens.length);
    if (this.grammarPending) this.grammar = await this.grammarPending;
    const cells = this.tokens.length + this.n * this.maxTokens;
    if (cells > ctx.nCtx) {
      throw invalid(
        `the request needs up to ${cells} KV cells (prompt ${this.tokens.length} + n ${this.n} × maxTokens ${this.maxTokens}) but the context has nCtx ${ctx.nCtx}; lower maxTokens or n, or create the context with a larger nCtx`,
      );
    }
    const leases = this.n + this.cachePoints.length;
    if (leases > ctx.nSeqMax) {
      throw invalid(
        `the request needs ${leases} sequence leases (n ${this.n} + ${this.cachePoints.length} prompt branches) but the context has nSeqMax ${ctx.nSeqMax}; lower n or create the context with a larger nSeqMax`,
      );
    }
  }

  /**
   * What admitting the request takes now: the best cached start of its prompt (`entry`, `start`),
   * and the KV cells and leases it needs beyond it.
   * @param {import('./prefix-cache').PrefixCache} cache
   */
  needs(cache) {
    const { entry, length } = cache.bestStart(this.tokens);
    return { entry, ...this.needsFrom(length) };
  }

  /** The KV cells and leases the request needs beyond a cached start of `start` tokens. */
  needsFrom(start) {
    const cells = this.tokens.length - start + this.n * this.maxTokens;
    const leases = this.n + this.cachePoints.filter((p) => p > start).length;
    return { start, cells, leases };
  }

  /** Its ids: the prompt line is the request's own id, the choices `id.0`, `id.1`, ... */
  lineId() {
    const k = this.lineCount++;
    return k === 0 ? this.id : `${this.id}.${k - 1}`;
  }

  admitted({ start }) {
    const kind = this.input.messages !== undefined ? 'chat' : 'completion';
    return { kind, n: this.n, maxTokens: this.maxTokens, promptTokens: this.tokens.length, cachedTokens: start };
  }

  /** Admitted: its prompt line, and its n choices forked from it, each with its gen. */
  begin({ start, leases, entry }) {
    this.plannedStart = start;
    // The entry admission counted on stays pinned until the prompt line forks it (`started`):
    // admitting the next request could otherwise evict it first, and this one would prefill
    // more of its prompt than it reserved cells for (ERR_KV_FULL from llama.cpp mid-step).
    this.plannedEntry = entry && start > 0 ? this.cache.pin(entry) : null;
    this.maxBranches = leases;
    this.maxCells = this.tokens.length + this.n * this.maxTokens;
    this.promptTokens = this.tokens.length;
    const { maxTokens, stops, grammar, grammarLazy: lazy, logprobs } = this;
    const prompt = this.freshLine([]);
    prompt.sealed = true;
    prompt.cachePoints = this.cachePoints;
    const text = this.chat ? this.chat.formatted.prompt : this.input.prompt;
    prompt.push(this.tokens, text === undefined ? `(${this.tokens.length} prompt tokens)` : text);
    this.prompt = prompt;
    this.spawn(prompt, this.n).forEach((line, index) => {
      const params = { ...this.params, seed: (this.seedBase + index) % SEED_SPACE };
      const chat = this.chat && this.chat.parse ? new ChatStream(this.chat) : null;
      const choice = new Choice(index, this.push, chat);
      const job = new GenJob({ maxTokens, stops, params, grammar, lazy, logprobs, choice });
      job.done.promise.catch(() => {}); // a failure is the request's, reported by settle
      this.choices.push(choice);
      line.start(job);
    });
  }

  /** The prompt line got its branch, `line.cached` prompt tokens from the prefix cache. */
  started(line) {
    this.unpinPlanned();
    this.cachedPromptTokens = line.cached;
  }

  /** `count` prompt tokens were prefilled (`promptTokens` counts the whole prompt from the start). */
  prefilled(count) {
    this.prefilledCells += count;
  }

  /** Each lease is taken once, never given back to the request (a filled prompt's goes to the cache). */
  get leasesToCome() {
    if (this.state !== 'running') return 0;
    return Math.max(0, this.maxBranches - this.written('leases'));
  }

  /** Its unfilled prompt and every token left to generate. */
  cellsToCome() {
    if (this.state !== 'running') return 0;
    const filled = this.prompt.state === 'waiting' ? this.plannedStart : this.prompt.filled;
    let cells = this.tokens.length - filled;
    for (const c of this.choices) if (c.state === 'generating') cells += this.maxTokens - c.generated;
    return cells;
  }

  unpinPlanned() {
    if (this.plannedEntry) this.cache.unpin(this.plannedEntry);
    this.plannedEntry = null;
  }

  detach() {
    super.detach();
    this.unpinPlanned();
  }

  /** Its last choice ended: the request ends (settled at the next step, once its branches are back). */
  get complete() {
    return this.choices.every((c) => c.state === 'ended');
  }

  /** A failure of any choice is the whole request's. */
  ownerOf() {
    return this;
  }

  lineFailed(line, error) {
    this.end({ error });
  }

  /** At its end, choices still running end with finishReason 'abort'. */
  endJobs() {
    for (const line of this.lines) if (line.job) line.endJob('abort');
  }

  /** Its signal fired: running, it ends at the next step; queued, it settles now. Either way it resolves. */
  abort() {
    if (this.state === 'running') this.end({ abort: true });
    else if (this.state === 'queued' || this.state === 'ready') this.endUnstarted();
  }

  /** The scheduler closes: running choices end with finishReason 'abort'. */
  close() {
    this.end({ abort: true });
  }

  /** A request that ends before it started: n empty choices, all ended 'abort'. */
  endUnstarted() {
    this.to('done');
    this.detach();
    for (let index = 0; index < this.n; index++) {
      const choice = new Choice(index, this.push, null);
      choice.abortUnstarted();
      this.choices.push(choice);
    }
    this.sink.finish(this.result());
  }

  /** The `done` event's status and usage (none when nothing was generated). */
  ending({ error, abort }) {
    const aborted = abort || this.choices.some((c) => c.state === 'ended' && c.result.finishReason === 'abort');
    const usage = this.usage.completionTokens > 0 ? this.usageOut() : null;
    return { status: error ? 'error' : aborted ? 'abort' : 'ok', usage };
  }

  /** Usage as results and events show it: draft counts only when the request speculated. */
  usageOut() {
    const { draftTokens, acceptedDraftTokens, ...usage } = this.usage;
    return this.spec && this.logprobs === undefined ? { ...usage, draftTokens, acceptedDraftTokens } : usage;
  }

  result() {
    return { choices: this.choices.map((c) => c.result), usage: this.usageOut() };
  }
}

module.exports = { RequestProgram };
