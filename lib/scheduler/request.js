'use strict';

/**
 * One `scheduler.generate()` request: its validated inputs and ONE explicit `state` (the idea of
 * llama.cpp's server `slot_state`), changed only through `to()`, which refuses a transition the
 * life cycle does not have:
 *
 *   queued ──▶ ready ──▶ prefilling ──▶ generating ──▶ done
 *     │          │           │              │           ▲
 *     │          │           └──▶ aborting ◀┘ ──────────┤
 *     └──────────┴──────────────────────────────────────┴──▶ failed (from any live state)
 *
 * queued: waiting, not yet tokenized; ready: tokenized and checked, waiting for admission;
 * prefilling: admitted, its prompt branch being filled (possibly waiting for a cached prefix
 * another request fills); generating: its n choices sample and commit each step; aborting: its
 * signal fired (or the scheduler closed) while running, ended at the start of the next step;
 * done / failed: settled, everything given back.
 */

const { makeError } = require('../errors');
const { SEED_SPACE, invalid, positiveInt, checkInput, checkStops, checkLogprobs, checkSampling } = require('./checks');
const { tokenLogprob } = require('./line');
const { signalOf } = require('../cancel');
const { StopMatcher } = require('./stops');
const { release } = require('../Context');
const { checkChat, formatTurn, ChatStream } = require('./chat');
const { DraftLength } = require('./speculation');
const { clipped, perplexityOf, roundedPerplexity, doneFields } = require('./events');

const TRANSITIONS = {
  queued: ['ready', 'done', 'failed'],
  ready: ['prefilling', 'done', 'failed'],
  prefilling: ['generating', 'aborting', 'failed'],
  generating: ['aborting', 'done', 'failed'],
  aborting: ['done', 'failed'],
  done: [],
  failed: [],
};

class Request {
  /**
   * Checks `request` (throws ERR_INVALID_ARG) and starts it queued.
   * @param {any} request what `generate` was given
   * @param {{ push: (event: any) => void, finish: (result: any) => void, fail: (error: any) => void }} sink
   *   what feeds its Generation: its events and result
   * @param {{ vocabSize: number, defaultMaxTokens: number, jsonSchemaToGrammar: (schema: any) => Promise<string>, events: import('./events').SchedulerEvents }} env
   */
  constructor(request, sink, env) {
    checkInput(request, env.vocabSize);
    /** Where the request's events go, and its id in them (see ./events.js). */
    this.events = env.events;
    this.id = env.events.nextId('request');
    this.wasAdmitted = false;
    const { params, seed, grammar } = checkSampling(request);
    this.state = 'queued';
    this.sink = sink;
    this.input = request;
    this.n = positiveInt(request.n, 'request.n', 1);
    this.maxTokens = positiveInt(request.maxTokens, 'request.maxTokens', env.defaultMaxTokens);
    this.stops = checkStops(request.stop);
    /** Top alternatives per token when log-probabilities were asked for, else undefined. */
    this.logprobs = checkLogprobs(request.logprobs, 'request.logprobs');
    this.params = params;
    this.seedBase = seed === undefined || seed === -1 ? Math.floor(Math.random() * SEED_SPACE) : seed;
    this.grammar = grammar;
    /** formatChat's options (tools, toolChoice, reasoning), and the ChatTurn once prepared. */
    this.chatOptions = checkChat(request);
    this.chat = null;
    /** Lazy-grammar triggers of a tool-call grammar (null: the grammar applies from the start). */
    this.grammarLazy = null;
    /** Converted off the main thread from now on; awaited when the request is prepared. */
    this.grammarPending = request.jsonSchema !== undefined ? env.jsonSchemaToGrammar(request.jsonSchema) : null;
    if (this.grammarPending) this.grammarPending.catch(() => {}); // reported when prepared
    this.signal = signalOf({ signal: request.signal }, 'generate');
    this.onAbort = null;
    /** The prompt's tokens, and where the prompt is cut into cached prefixes (ready on). */
    this.tokens = null;
    this.cachePoints = null;
    /** Prefilling: the cache start planned at admission, the prompt branch and how far it is filled. */
    this.plannedStart = 0;
    this.branch = null;
    this.segment = null;
    this.pos = 0;
    /** Cache entries this request pins, and leases it has yet to take. */
    this.pins = [];
    this.leasesToCome = 0;
    /** Generating: `{index, branch, tokens, matcher, finishReason, perplexity}` per choice. */
    this.choices = null;
    this.usage = { promptTokens: 0, cachedPromptTokens: 0, completionTokens: 0 };
    /**
     * Speculation (set at admission when the scheduler speculates and the request does not ask
     * for log-probabilities, which need each token's own snapshot): the draft source and the
     * step-cost fit every line of this scheduler shares.
     * @type {{ source: any, maxDraft: number, adaptive: boolean, cost: any } | null}
     */
    this.spec = null;
  }

  /** Moves to `state`, or throws: a transition the life cycle lacks is a bug in the Scheduler. */
  to(state) {
    if (!TRANSITIONS[this.state].includes(state)) {
      throw makeError(
        'ERR_INTERNAL',
        `Scheduler request: no transition from ${this.state} to ${state}; please report this bug`,
      );
    }
    this.state = state;
  }

  /**
   * What admitting the request takes now: the best cached start of its prompt (its `entry`, kept
   * from eviction meanwhile, and its `start` in tokens), and the KV cells and the leases it needs
   * beyond that start.
   * @param {import('./prefix-cache').PrefixCache} cache
   */
  needs(cache) {
    const { entry, length: start } = cache.bestStart(this.tokens);
    const cells = this.tokens.length - start + this.n * this.maxTokens;
    const leases = this.n + this.cachePoints.filter((p) => p > start).length;
    return { entry, start, cells, leases };
  }

  /**
   * Admitted with what `needs` found (`prefilling` from now on): its `admit` event and its prompt
   * as the root node of its tree. It speculates with the scheduler's `spec` unless it asks for
   * log-probabilities, which need each token's own snapshot, which a verified draft does not keep.
   * @param {{ start: number, leases: number }} need
   * @param {{ source: any, maxDraft: number, adaptive: boolean, cost: any } | null} spec
   */
  admit({ start, leases }, spec) {
    this.plannedStart = start;
    this.leasesToCome = leases;
    this.usage.promptTokens = this.tokens.length;
    this.spec = spec && this.logprobs === undefined ? spec : null;
    this.to('prefilling');
    this.wasAdmitted = true;
    const { events, id } = this;
    if (!events.on) return;
    const kind = this.input.messages !== undefined ? 'chat' : 'completion';
    const text = this.chat ? this.chat.formatted.prompt : this.input.prompt;
    const promptTokens = this.tokens.length;
    const { n, maxTokens } = this;
    events.emit('admit', { request: id, kind, n, maxTokens, promptTokens, cachedTokens: start });
    events.emit('fork', { request: id, branch: id, parent: null, at: 0 });
    events.emit('append', {
      request: id,
      branch: id,
      n: promptTokens,
      text: text === undefined ? `(${promptTokens} prompt tokens)` : clipped(text),
    });
  }

  /** Settled: its `done` event (`status` 'ok', 'abort' or 'error'). */
  ended(status, error) {
    if (!this.events.on || !this.wasAdmitted) return; // a request refused in the queue has no tree
    const usage = this.usage.completionTokens ? this.usage : null;
    this.events.emit('done', { request: this.id, ...doneFields(status, error, usage) });
  }

  /** Running: admitted and not settled. */
  get running() {
    return this.state === 'prefilling' || this.state === 'generating' || this.state === 'aborting';
  }

  /**
   * Tokenizes the prompt (chat template for messages, on the context's worker), finds where it is
   * cut into cached prefixes, resolves the grammar and checks that the request fits the context.
   * @param {import('../Context').SessionContext} ctx
   * @param {import('./system-prompts').SystemPrompts} systemPrompts
   */
  async prepare(ctx, systemPrompts) {
    const { prompt, tokens, messages } = this.input;
    this.cachePoints = [];
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
   * Gives the admitted request its prompt branch, forked from the best cached start (or made by
   * `createBranch`). Returns the count of prompt tokens the cache saved, or null while the start
   * it wants is still being prefilled by an earlier request.
   */
  begin(cache, createBranch) {
    const start = cache.bestStart(this.tokens);
    const { entry } = start;
    // Never fork the whole prompt's logits from a partial fork: at least one token is decoded.
    const length = start.partial ? Math.min(start.length, this.tokens.length - 1) : start.length;
    if (entry && !entry.ready && entry.branch.position < length) return null;
    if (entry) this.pins.push(cache.pin(entry));
    this.usage.cachedPromptTokens = length;
    if (entry && length === this.tokens.length) {
      this.spawnChoices(entry.branch); // the whole prompt is cached, logits included
      return length;
    }
    if (!entry) this.branch = createBranch();
    else if (start.partial) this.branch = entry.branch.forkAt(length);
    else this.branch = entry.branch.fork();
    this.leasesToCome--;
    this.pos = length;
    this.openSegment(cache);
    return length;
  }

  /** The prompt branch becomes a (growing) cache entry up to the next cache point. */
  openSegment(cache) {
    const end = this.cachePoints.find((p) => p > this.pos);
    this.segment = cache.open(this.tokens.slice(0, end), this.branch);
    this.pins.push(cache.pin(this.segment));
  }

  /**
   * `take` more prompt tokens are in the prompt branch. A segment filled becomes a ready cache
   * entry the request goes on from (`segmentFilled`); when the request was aborted meanwhile,
   * the filled prefix just stays cached.
   */
  prefilled(take, cache) {
    this.pos += take;
    if (this.pos < this.segment.tokens.length) return;
    if (this.state === 'prefilling') this.segmentFilled(cache);
    else cache.filled(this.segment);
  }

  /** The segment is filled: the choices start from it, or the next segment opens in a fork. */
  segmentFilled(cache) {
    const entry = this.segment;
    cache.filled(entry);
    if (this.pos === this.tokens.length) {
      this.spawnChoices(entry.branch);
      return;
    }
    this.branch = entry.branch.fork(); // the cached prefix stays; the request goes on in a fork
    this.leasesToCome--;
    this.openSegment(cache);
  }

  /** The n choices, each sampling from a fork of `from` with the request's params and its own seed. */
  spawnChoices(from) {
    this.segment = null;
    this.branch = null;
    this.leasesToCome = 0;
    this.choices = [];
    this.to('generating');
    for (let i = 0; i < this.n; i++) {
      const branch = from.fork();
      this.choices.push({
        index: i,
        branch,
        tokens: [],
        matcher: new StopMatcher(this.stops),
        finishReason: null,
        perplexity: Infinity,
        logprobs: this.logprobs === undefined ? null : [],
        chat: this.chat && this.chat.parse ? new ChatStream(this.chat) : null,
        message: null,
        /** Speculating: the choice's drafter, its draft length, and the token verification sampled next. */
        drafter: this.spec ? this.spec.source.open(this.tokens) : null,
        draftLength: this.spec ? new DraftLength(this.spec) : null,
        next: null,
      });
      if (this.events.on)
        this.events.emit('fork', {
          request: this.id,
          branch: `${this.id}.${i}`,
          parent: this.id,
          at: this.tokens.length,
        });
      const params = { ...this.params, seed: (this.seedBase + i) % SEED_SPACE };
      if (this.grammar && !this.grammarLazy) params.grammar = this.grammar;
      branch.setSamplerParams(params);
      if (this.grammarLazy) branch.setGrammar(this.grammar, this.grammarLazy);
    }
  }

  /** Ends `choice` with `reason`: its perplexity is read, its branch freed, its last event sent. */
  finishChoice(choice, reason) {
    if (choice.drafter) choice.drafter.close();
    choice.drafter = null;
    const rest = choice.matcher.flush(); // the events' texts add up to the result's text
    let delta = null;
    if (choice.chat && reason !== 'abort') {
      delta = choice.chat.finish(choice.matcher.text);
      choice.message = choice.chat.message;
      if (choice.message.toolCalls.length > 0 && reason === 'stop') reason = 'tool_calls';
    }
    choice.finishReason = reason;
    if (choice.branch && !choice.branch.disposed) {
      try {
        choice.perplexity = choice.branch.perplexity;
      } catch {
        // busy or disposed: keep Infinity
      }
    }
    if (this.events.on && choice.branch) {
      const ppl = roundedPerplexity(choice.perplexity);
      const branch = `${this.id}.${choice.index}`;
      const n = this.tokens.length + choice.tokens.length;
      this.events.emit('finish', { request: this.id, branch, reason, n, ppl });
    }
    release(choice.branch);
    choice.branch = null;
    const end = { choice: choice.index, token: null, text: rest, finishReason: reason };
    this.sink.push(choice.chat ? { ...end, delta, message: choice.chat.message } : end);
  }

  /** Gives back everything the request holds; an unfinished prompt segment leaves the cache. */
  giveBack(cache) {
    if (this.segment && !this.segment.ready) cache.evict(this.segment, false);
    if (this.branch && this.branch !== (this.segment && this.segment.branch)) release(this.branch);
    for (const choice of this.choices || []) {
      if (!choice.finishReason) this.finishChoice(choice, 'abort');
    }
    for (const entry of this.pins) cache.unpin(entry);
    this.pins = [];
    this.segment = null;
    this.branch = null;
    if (this.signal && this.onAbort) this.signal.removeEventListener('abort', this.onAbort);
  }

  /** A request that ends before it generated: n empty choices, all ended with `reason`. */
  endUnstarted(reason) {
    this.choices = Array.from({ length: this.n }, (_, index) => ({
      index,
      branch: null,
      tokens: [],
      matcher: new StopMatcher([]),
      finishReason: null,
      perplexity: Infinity,
      logprobs: null,
      chat: null,
      message: null,
      drafter: null,
      draftLength: null,
      next: null,
    }));
    for (const choice of this.choices) this.finishChoice(choice, reason);
  }

  /**
   * The decode phase's rows of the unfinished choices (see ./rows.js); `onToken()` counts each
   * token sampled, `fail(request, error)` fails the whole request.
   */
  decodeRows(onToken, fail) {
    return this.choices
      .filter((c) => !c.finishReason)
      .map((choice) => ({
        branch: choice.branch,
        owner: this,
        carried: choice.next || undefined,
        live: () => this.state === 'generating',
        take: (produced) => this.take(choice, produced, onToken),
        committed: () => {},
        fail: (e) => fail(this, e),
        ...(choice.drafter
          ? {
              spec: {
                drafter: choice.drafter,
                length: choice.draftLength,
                // The last token comes from `next`, accepted without a decode, as without speculation.
                limit: () => this.maxTokens - choice.tokens.length - 1,
              },
              verified: (token, accepted, next, drafted) =>
                this.verified(choice, { token, accepted, next, drafted }, onToken),
            }
          : {}),
      }));
  }

  /**
   * A speculative step's outcome for `choice`: the accepted draft tokens (already committed) are
   * taken like sampled ones, and the token verification sampled next is kept for the next step.
   */
  verified(choice, { token, accepted, next, drafted }, onToken) {
    this.usage.draftTokens = (this.usage.draftTokens || 0) + drafted;
    this.usage.acceptedDraftTokens = (this.usage.acceptedDraftTokens || 0) + accepted.length;
    for (const produced of accepted) {
      if (choice.finishReason) return;
      this.take(choice, produced, onToken, true);
    }
    if (choice.finishReason) return;
    if (choice.drafter) choice.drafter.accept([token, ...accepted.map((p) => p.token)]);
    choice.next = next;
  }

  /**
   * Takes a produced token into its choice; true when it is still to be committed. `committed`:
   * an accepted draft token, already decoded and accepted.
   */
  take(choice, produced, onToken, committed = false) {
    choice.next = null;
    if (produced.isStop) {
      this.finishChoice(choice, 'stop');
      return false;
    }
    choice.tokens.push(produced.token);
    this.usage.completionTokens++;
    onToken();
    const text = choice.matcher.push(produced.text);
    /** @type {any} */
    const event = { choice: choice.index, token: produced.token, text };
    if (choice.logprobs) {
      const lp = tokenLogprob(choice.branch, produced, this.logprobs);
      choice.logprobs.push(lp);
      event.logprob = lp.logprob;
      event.top = lp.top;
    }
    if (choice.chat)
      event.delta = text === '' ? null : choice.chat.update(choice.matcher.text.slice(0, choice.matcher.released));
    this.sink.push(event);
    if (this.events.on) {
      const n = this.tokens.length + choice.tokens.length;
      const [branch, ppl] = [`${this.id}.${choice.index}`, perplexityOf(choice.branch)];
      this.events.emit('token', {
        request: this.id,
        branch,
        text: produced.text,
        n,
        ppl,
        ...(committed ? { draft: true } : {}),
      });
    }
    const reason = choice.matcher.stopped ? 'stop' : choice.tokens.length >= this.maxTokens ? 'length' : null;
    if (!reason) return true;
    // Not decoded (nothing will be sampled after it), but accepted so perplexity counts it.
    try {
      if (!committed) choice.branch.accept(produced.token);
    } catch {
      // perplexity then leaves the last token out; the text is complete either way
    }
    this.finishChoice(choice, reason);
    return false;
  }

  /** KV cells this request may still write: its unfilled prompt and every token left to generate. */
  cellsToCome() {
    if (this.choices) {
      let cells = 0;
      for (const c of this.choices) if (!c.finishReason) cells += this.maxTokens - c.tokens.length;
      return cells;
    }
    const filled = this.branch || this.segment ? this.pos : this.plannedStart;
    return this.tokens.length - filled + this.n * this.maxTokens;
  }

  /** The result `generate` resolves with. */
  result() {
    return {
      choices: this.choices.map((c) => ({
        text: c.matcher.text,
        tokens: c.tokens,
        finishReason: c.finishReason,
        perplexity: c.perplexity,
        ...(c.logprobs ? { logprobs: c.logprobs } : {}),
        ...(c.message || {}),
      })),
      usage: { ...this.usage },
    };
  }
}

module.exports = { Request };
