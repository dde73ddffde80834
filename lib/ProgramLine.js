'use strict';

/**
 * The user's side of a branch program's line (the Scheduler's is a `Line`, ./scheduler/line.js,
 * held privately). docs/programs.md is the guide.
 */

const { makeError } = require('./errors');
const { SchedulerErrorCode: Code, schedulerError } = require('./scheduler/errors');
const { positiveInt, invalid, isTokenIds, checkStops, checkSampling, checkLogprobs } = require('./scheduler/checks');
const { GenJob, PeekJob, MoveJob } = require('./scheduler/jobs');
const { regexGrammar, choicesGrammar } = require('./scheduler/grammars');
const { scoreTexts } = require('./scheduler/scoring');
const { firstTurn, laterTurn } = require('./scheduler/chat');
const { markMessages, tokenizeMarked, unmark } = require('./scheduler/plain-text');
const { MediaPrompt } = require('./Context');
const { linePiecesOf, mediaText } = require('./scheduler/media');

/**
 * One line of generation inside a program (the `s` of `run(async (s) => ...)`). A line runs one
 * gen, select or logprob at a time: `append`, `gen`, `fork`, `select` and `logprob` while one
 * runs, after `release()` or after the program ended throw `ERR_PROGRAM_STATE` (the async ones
 * reject; after an aborted program, with its `ERR_ABORTED`).
 */
class ProgramLine {
  /** @type {import('./scheduler/line').Line} */
  #line;
  /** @type {import('./scheduler/program').Program} */
  #program;
  /** @type {object | null} the select or multi-token logprob running on the line (its options are scored in forks) */
  #selecting = null;

  /** Made by `Scheduler.run` (the root) and `fork`, never directly. */
  constructor(line, program) {
    this.#line = line;
    this.#program = program;
  }

  /** The line's text: what was appended as text and what gen produced, in order. */
  get text() {
    return this.#line.text;
  }

  /** Every token of the line (prompt, generated and appended), in order. */
  get tokens() {
    return this.#line.tokens.slice();
  }

  /** The line's id in the Scheduler's events (`p1.0`, `p1.1`, …: docs/events.md). */
  get id() {
    return this.#line.id;
  }

  /** True while the line is parked ({@link park}). */
  get parked() {
    return this.#line.state === 'parked';
  }

  /** Whether release() was called or the program ended. */
  get released() {
    return this.#line.released || this.#line.state === 'freed';
  }

  /**
   * Appends prompt text (tokenized now, without special tokens except the BOS of a program's
   * first text), token ids, or chat messages: on an empty line, rendered with the model's chat
   * template up to the assistant's turn (whose end-of-turn strings then stop every gen of the line
   * and its forks); on a line started so, after the assistant's reply, the next turn (the turn
   * separator, then the messages rendered alone: nothing is decoded again). A `MediaPrompt`
   * (`ctx.tokenizeParts(parts)`; `tokenizeParts(parts, false)` after the line's first text, so no
   * second BOS) appends text and images: each image is encoded once, when the line next needs
   * its KV, and the prefix cache keys it by its bytes (docs/images.md). Nothing is decoded
   * until the line next needs its KV: a gen, or a fork's first step. Returns the line.
   * @param {string | number[] | readonly import('./types').ChatMessage[] | MediaPrompt} input
   * @returns {this}
   */
  append(input) {
    const line = this.#checkIdle('append', false);
    const ctx = this.#program.ctx;
    if (Array.isArray(input) && input.length > 0 && input.every((m) => m !== null && typeof m === 'object')) {
      // Messages' text that spells control tokens stays plain text unless the Scheduler parses it.
      const messages = this.#program.env.parseSpecial ? input : markMessages(ctx, input);
      if (line.tokens.length === 0) {
        const { tokens, text, stops } = firstTurn(ctx, messages);
        line.pushTurn(tokens, text, stops);
        return this;
      }
      if (line.chat === null)
        throw invalid('append(messages): this line did not start with chat messages; append text or tokens to it');
      if (line.chat === 'open')
        throw invalid('append(messages): the assistant turn is open; gen its reply (or append its text) first');
      const { tokens, text } = laterTurn(ctx, line.tokens, messages);
      line.pushTurn(tokens, text);
      return this;
    }
    if (input instanceof MediaPrompt) {
      if (!ctx.hasProjector)
        throw makeError(
          'ERR_NO_PROJECTOR',
          'append(prompt): a prompt with images needs a context created with mmprojPath',
        );
      const { tokens, images } = linePiecesOf(input, line.tokens.length);
      line.pushMedia(input, tokens, images, mediaText(ctx, input));
      return this;
    }
    // Text or tokens after an open turn are the assistant's reply (Line.push).
    let tokens, text;
    if (typeof input === 'string') {
      tokens = input === '' ? [] : tokenizeMarked(ctx, input, line.tokens.length === 0);
      text = unmark(input);
    } else if (isTokenIds(input, ctx.vocabSize)) {
      tokens = input.slice();
      text = tokens.map((t) => ctx.tokenToText(t)).join('');
    } else {
      throw invalid(`append(input): input must be a string or an array of token ids in [0, ${ctx.vocabSize})`);
    }
    line.push(tokens, text);
    return this;
  }

  /**
   * Generates after the line's text and appends the result to it. The tokens are sampled in the
   * scheduler's steps, one per step, in the same decode as everything else that runs.
   * @param {import('./types').ProgramGenOptions} [options]
   * @returns {Promise<import('./types').ProgramGenResult>}
   */
  async gen(options = {}) {
    const line = this.#checkIdle('gen');
    if (options === null || typeof options !== 'object') throw invalid('gen(options?): options must be an object');
    if (line.tokens.length === 0) throw invalid('gen(): the line is empty; append a prompt first');
    const program = this.#program;
    const { params, seed, grammar } = checkSampling(options);
    const choices = options.choices === undefined ? null : choicesGrammar(options.choices);
    const given = [grammar, options.jsonSchema, choices, options.regex].filter((c) => c !== undefined && c !== null);
    if (given.length > 1) throw invalid('gen: give one of grammar, jsonSchema, choices or regex');
    if (options.regex !== undefined && (typeof options.regex !== 'string' || options.regex === ''))
      throw invalid('gen: regex must be a non-empty string (a JavaScript-style regular expression source)');
    const job = new GenJob({
      maxTokens: positiveInt(options.maxTokens, 'options.maxTokens', program.env.defaultMaxTokens),
      stops: [...checkStops(options.stop), ...line.stops],
      params: { ...params, seed: seed === undefined ? program.nextSeed() : seed },
      grammar: grammar || choices,
      logprobs: checkLogprobs(options.logprobs, 'options.logprobs'),
    });
    const done = line.start(job); // the line is busy from now on, even while a JSON schema converts
    try {
      const { jsonSchemaToGrammar } = program.env;
      if (options.jsonSchema !== undefined) job.setGrammar(await jsonSchemaToGrammar(options.jsonSchema));
      if (options.regex !== undefined) job.setGrammar(await regexGrammar(options.regex, jsonSchemaToGrammar));
    } catch (e) {
      line.cancel(job);
      throw e;
    }
    if (line.job !== job) throw program.endedError(); // the program ended meanwhile
    program.wake(); // the Scheduler serves it from its next step
    return done;
  }

  /**
   * `n` new lines that continue from this one (they share its KV prefix; each samples with its
   * own seed). The parent stays usable. Throws ERR_TOO_MANY_BRANCHES past the program's
   * `maxBranches`, at once (never waits for leases).
   * @param {number} [n]
   * @returns {ProgramLine[]}
   */
  fork(n = 1) {
    const line = this.#checkIdle('fork');
    positiveInt(n, 'fork(n): n', 1);
    const program = this.#program;
    program.reserveLines(n);
    // Forks are extra lines: a scheduler's step budget admits them only within its time.
    return program.spawn(line, n, line.tokens, true).map((child) => new ProgramLine(child, program));
  }

  /**
   * Scores each option as the continuation of the line's text and appends the best. Options are
   * scored in forks (a logits row per token) in the scheduler's steps; a token several options
   * share is scored once (a fork per leaf of their trie, made where the options part, a step later
   * per level). The winner's fork becomes the line's KV, so its tokens are not decoded again
   * (unless the winner is a prefix of another option). `method`: `'total'` (the sum of the tokens'
   * log-probabilities, default), `'normalized'` (the mean per token) or `'unconditional'` (the sum
   * minus the option's sum after only the BOS token: how much the line's text raises it). The forks
   * count against `maxBranches` while they score (one per option that is not a prefix of another;
   * twice as many for `'unconditional'`).
   * @param {string[]} options
   * @param {{ method?: 'total' | 'normalized' | 'unconditional' }} [settings]
   * @returns {Promise<import('./types').SelectResult>}
   */
  async select(options, settings = {}) {
    const line = this.#checkIdle('select');
    const ctx = this.#program.ctx;
    if (!Array.isArray(options) || options.length === 0 || !options.every((o) => typeof o === 'string' && o !== ''))
      throw invalid('select(options): options must be a non-empty array of non-empty strings');
    const method = settings && settings.method !== undefined ? settings.method : 'total';
    if (!['total', 'normalized', 'unconditional'].includes(method))
      throw invalid(`select: method must be 'total', 'normalized' or 'unconditional', got ${JSON.stringify(method)}`);
    if (line.tokens.length === 0) throw invalid('select(): the line is empty; append a prompt first');
    const tokens = options.map((o) => tokenizeMarked(ctx, o, false));
    if (tokens.some((t) => t.length === 0)) throw invalid('select: an option tokenized to nothing');
    const bos = method === 'unconditional' ? ctx.tokenizeSync('', true) : [];
    if (method === 'unconditional' && bos.length === 0)
      throw makeError('ERR_UNSUPPORTED', "select: method 'unconditional' needs a model with a BOS token");
    return this.#scoreTexts(tokens, bos.length > 0 ? bos : null, (sums, base, leafOf) => {
      const scores = sums.map((sum, i) => {
        if (method === 'normalized') return sum / tokens[i].length;
        return base ? sum - base[i] : sum;
      });
      const index = scores.reduce((best, s, i) => (s > scores[best] ? i : best), 0);
      this.append(options[index]);
      line.adopt(leafOf(index)); // the winner's fork holds its tokens: they are not decoded again
      return { choice: unmark(options[index]), index, scores };
    });
  }

  /**
   * The natural-log probability of `text` (or token ids) as the line's continuation; the line
   * does not change. One token is read from the logits the line holds (no extra decode), with the
   * `top` (0..20) most likely next tokens; several are scored in a fork as `select` does (it counts
   * against `maxBranches`).
   * @param {string | number[]} text
   * @param {{ top?: number }} [options]
   * @returns {Promise<{ logprob: number, top: import('./types').TopLogprob[] }>}
   */
  async logprob(text, options = {}) {
    const line = this.#checkIdle('logprob');
    const ctx = this.#program.ctx;
    const tokens = typeof text === 'string' ? tokenizeMarked(ctx, text, false) : text;
    if (!isTokenIds(tokens, ctx.vocabSize) || tokens.length === 0)
      throw invalid(`logprob(text): give a non-empty string or token ids in [0, ${ctx.vocabSize})`);
    if (line.tokens.length === 0) throw invalid('logprob(): the line is empty; append a prompt first');
    const top = checkLogprobs((options && options.top) || 0, 'options.top');
    if (tokens.length === 1) return this.#start(new PeekJob(tokens[0], top));
    return this.#scoreTexts([tokens], null, ([logprob]) => ({ logprob, top: [] }));
  }

  /**
   * The natural-log probabilities (log-softmax over the whole vocabulary, in the order given) of
   * candidate next tokens, e.g. single-token answer labels, all read from the one logits row the
   * line holds (no extra decode; the line does not change).
   * @param {number[]} tokens token ids
   * @returns {Promise<number[]>}
   */
  async logprobs(tokens) {
    const line = this.#checkIdle('logprobs');
    const ctx = this.#program.ctx;
    if (!isTokenIds(tokens, ctx.vocabSize) || tokens.length === 0)
      throw invalid(`logprobs(tokens): give a non-empty array of token ids in [0, ${ctx.vocabSize})`);
    if (line.tokens.length === 0) throw invalid('logprobs(): the line is empty; append a prompt first');
    return this.#start(new PeekJob(tokens.slice()));
  }

  /**
   * Answers typed questions (noul, choice, score) about the line's text so far, as
   * `scheduler.decide` does: each question on a fork of the line (after a blank line, raw), read
   * in shared steps; the line does not change. `options`: `permute`, `read`, `maxQuestions`, and
   * `parallel` (lines at once beside this one; default 3). See docs/decisions.md.
   * @param {Record<string, import('./types').DecisionQuestion>} questions
   * @param {import('./types').LineDecideOptions} [options]
   * @returns {Promise<Record<string, import('./types').DecisionAnswer>>}
   */
  decide(questions, options) {
    const line = this.#checkIdle('decide');
    const program = this.#program;
    const emit = (fields) => program.events.emit('decision', { branch: line.id, ...fields });
    // Decisions are a client of lines (../decisions): the Scheduler gives programs its entry point.
    return program.env.decideOnLine(this, program.ctx, questions, options, emit, program.env.parseSpecial);
  }

  /**
   * Parks the line at the next step: its branch gives back its lease and its own KV cells and
   * keeps, in host memory (or a spill file: `BranchStore.setParkSpill`), what it needs to go on
   * (Branch#park). It counts against `maxBranches` no more, so a program may hold more lines than
   * it has leases; `append` still works on it, `gen`, `fork`, `select`, `logprob(s)` and `decide`
   * throw `ERR_PROGRAM_STATE` until {@link resume}. A line with no KV yet (before its first gen)
   * or with a fork that has not started cannot park (`ERR_PROGRAM_STATE`).
   * @returns {Promise<void>}
   */
  async park() {
    const line = this.#checkIdle('park');
    if (line.state !== 'live')
      throw schedulerError(Code.PROGRAM_STATE, 'park(): the line has no KV yet (it starts at its first gen or fork)');
    if (line.lineStart.forks.length > 0)
      throw schedulerError(
        Code.PROGRAM_STATE,
        'park(): a fork of this line has not started yet; gen on it (or release it) first',
      );
    return this.#start(new MoveJob('parked'));
  }

  /**
   * Resumes a parked line at the next step (once its program has a lease free): its KV, logits
   * and sampler exactly as they were when it parked. Throws `ERR_TOO_MANY_BRANCHES` at once past
   * `maxBranches` (as `fork` does), and `ERR_PROGRAM_STATE` when the line is not parked or its
   * parent line is parked holding cells it shares (resume that one first); resolves once resumed
   * (`ERR_KV_FULL` past the program's `maxCells`: it stays parked).
   * @returns {Promise<void>}
   */
  async resume() {
    const line = this.#checkIdle('resume', false);
    if (line.state !== 'parked') throw schedulerError(Code.PROGRAM_STATE, 'resume(): the line is not parked');
    const parent = this.#parkedParent(line);
    if (parent)
      throw schedulerError(
        Code.PROGRAM_STATE,
        `resume(): its parent line ${parent.id} is parked and holds cells this one shares; resume ${parent.id} first`,
      );
    this.#program.reserveLines(1);
    return this.#start(new MoveJob('live'));
  }

  /** The parked line of this program whose cells `line`'s parked branch shares (null: none). */
  #parkedParent(line) {
    const handle = line.branch.parent;
    if (handle === null || line.branch.parkedInfo.shared === 0) return null;
    return this.#program.lines.find((l) => l.state === 'parked' && l.branch.handle === handle) || null;
  }

  /**
   * Gives the line's branch back at the next step (a gen in flight rejects with ERR_ABORTED).
   * Idempotent. Everything a program holds is released when it returns anyway.
   */
  release() {
    this.#line.release();
    this.#program.wake(); // the next step frees it
  }

  /** The line, once `op` may start on it: throws unless the program runs and the line is live (or parked, unless `needsKv`) and idle. */
  #checkIdle(op, needsKv = true) {
    const line = this.#line;
    if (this.#program.state !== 'running') throw this.#program.endedError();
    if (line.released || line.state === 'freed')
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): this line was released; use another line`);
    if (line.job || this.#selecting)
      throw schedulerError(
        Code.PROGRAM_STATE,
        `${op}(): a gen, select, park or resume is running on this line; await it first`,
      );
    if (needsKv && line.state === 'parked')
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): this line is parked; await line.resume() first`);
    return line;
  }

  /**
   * Scores `texts` in forks of the line (./scheduler/scoring.js); the line takes no other work
   * until `use` runs. Only this call's mark is cleared: once `use` ran, another select may have
   * begun before this call's `finally`.
   */
  async #scoreTexts(texts, bos, use) {
    const mine = {};
    const done = () => {
      if (this.#selecting === mine) this.#selecting = null;
    };
    this.#selecting = mine;
    try {
      return await scoreTexts(this.#program, this.#line, texts, bos, (sums, base, leafOf) => {
        done();
        return use(sums, base, leafOf);
      });
    } finally {
      done();
    }
  }

  /** Starts `job` on the line and wakes the Scheduler, which serves it from its next step. */
  #start(job) {
    const done = this.#line.start(job);
    this.#program.wake();
    return done;
  }
}

module.exports = { ProgramLine };
