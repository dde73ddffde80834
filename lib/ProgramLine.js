'use strict';

/**
 * One line of generation inside a branch program (the `s` of `scheduler.run(async (s) => ...)`):
 * a prompt it appends to, gens that continue it, forks that share its KV prefix. A line never
 * decodes by itself: it states what it needs and the Scheduler serves that in its steps, in the
 * same decode as everything else (lib/scheduler/program.js has the program's side; docs/programs.md
 * the guide). Members named `_…` are the Scheduler's.
 */

const { makeError } = require('./errors');
const { StopMatcher } = require('./scheduler/stops');
const { positiveInt, invalid, checkStops, checkSampling, checkLogprobs, tokenLogprob } = require('./scheduler/request');
const { SchedulerErrorCode: Code, schedulerError } = require('./scheduler/errors');
const { MIN_PARTIAL_REUSE } = require('./scheduler/prefix-cache');
const { clipped, perplexityOf } = require('./scheduler/events');
const { decideOnLine } = require('./scheduler/decide');

/** What `_forkCached` says when the prompt's entry is still being filled. */
const WAIT = Symbol('wait');

/**
 * The grammar of a regular expression, through llama.cpp's JSON-schema `pattern` support: the
 * schema `{ type: 'string', pattern }` becomes a grammar of a quoted JSON string whose root is
 * `"\"" (BODY) "\""`; the quotes are dropped so that the text itself matches. Anchors are
 * implied (the whole text matches). Anything else llama.cpp makes of it is ERR_UNSUPPORTED.
 */
async function regexGrammar(regex, toGrammar) {
  const pattern = `${regex.startsWith('^') ? '' : '^'}${regex}${regex.endsWith('$') ? '' : '$'}`;
  const grammar = await toGrammar({ type: 'string', pattern });
  const quoted = /^root ::= "\\"" \((.*)\) "\\""$/m;
  const m = quoted.exec(grammar);
  if (!m)
    throw makeError(
      'ERR_UNSUPPORTED',
      `gen: regex ${JSON.stringify(regex)} could not be turned into a grammar of its text`,
    );
  return grammar.replace(quoted, () => `root ::= (${m[1]})`);
}

/** A GBNF string literal of `text`. */
function gbnfLiteral(text) {
  return `"${text
    .replace(/[\\"]/g, (c) => `\\${c}`)
    .replace(/\n/g, '\\n')
    .replace(/\r/g, '\\r')
    .replace(/\t/g, '\\t')}"`;
}

/** The grammar of `choices`: the text is exactly one of them. */
function choicesGrammar(choices) {
  if (!Array.isArray(choices) || choices.length === 0 || !choices.every((c) => typeof c === 'string' && c !== ''))
    throw invalid('gen: choices must be a non-empty array of non-empty strings');
  return `root ::= ${choices.map(gbnfLiteral).join(' | ')}`;
}

/**
 * How `select` scores `options` (token arrays) so that a token several options share is scored
 * once: a trie of the options, cut into paths. A path starts at a token where options diverge
 * (at `depth` option tokens), follows the first option down to a leaf, and is scored by one
 * line, forked from its `parent` path's line at that depth (null: from the line selecting). Its
 * `ends` are the options ending on it, `[option, depth after the option's last token]`. One
 * path per leaf, so at most one line per option.
 * @param {number[][]} options
 * @returns {Array<{ parent: number | null, depth: number, tokens: number[], ends: Array<[number, number]> }>}
 */
function scoringPaths(options) {
  const node = () => ({ next: new Map(), ends: [] });
  const root = node();
  options.forEach((tokens, option) => {
    let at = root;
    for (const t of tokens) {
      if (!at.next.has(t)) at.next.set(t, node());
      at = at.next.get(t);
    }
    at.ends.push(option);
  });
  const paths = [];
  const walk = (token, from, parent, depth) => {
    const path = { parent, depth, tokens: [token], ends: [] };
    const index = paths.push(path) - 1;
    const forks = [];
    for (let at = from; ;) {
      const reached = depth + path.tokens.length;
      for (const option of at.ends) path.ends.push([option, reached]);
      const [first, ...rest] = at.next;
      if (!first) break;
      for (const [t, n] of rest) forks.push([t, n, reached]);
      path.tokens.push(first[0]);
      at = first[1];
    }
    for (const [t, n, at] of forks) walk(t, n, index, at);
  };
  for (const [t, n] of root.next) walk(t, n, null, 0);
  return paths;
}

/**
 * One line of generation inside a program (the `s` of `run(async (s) => ...)`). A line runs one
 * gen, select or logprob at a time: `append`, `gen`, `fork`, `select` and `logprob` while one
 * runs, after `release()` or after the program ended throw `ERR_PROGRAM_STATE` (the async ones
 * reject; after an aborted program, with its `ERR_ABORTED`).
 */
class ProgramLine {
  /**
   * Made by `Scheduler.run` (the root) and `fork`, never directly.
   * @param {any} program the program the line belongs to (lib/scheduler/program.js)
   * @param {ProgramLine | null} parent the line this one was forked from (null: a fresh line)
   * @param {number[]} tokens the line's tokens so far (a copy of the parent's at the fork)
   */
  constructor(program, parent, tokens) {
    this._program = program;
    this._parent = parent;
    /** Every token of the line: what is in its KV, then `_pending`. */
    this._tokens = tokens;
    /** Tokens of the line not yet in its branch's KV (prefilled when the line next needs them). */
    this._pending = parent ? [] : tokens.slice();
    /** The parent's token count at the fork: this line's branch forks the parent there. */
    this._anchor = tokens.length - this._pending.length;
    this._text = '';
    this._branch = null;
    /** Lines forked from this one that have not taken their branch from it yet. */
    this._dependents = 0;
    /** The gen in flight: options, output so far and its promise's resolve/reject. */
    this._job = null;
    /** The cache entry this line's branch is filling (its prompt, for others to fork), if any. */
    this._segment = null;
    /** Stop strings every gen of this line adds (the chat template's end of turn), inherited by forks. */
    this._stops = parent ? parent._stops : [];
    /**
     * Where the line's chat stands: null (it did not start with messages), 'open' (the
     * assistant's turn was just opened) or 'replied' (the assistant's turn has text: a later
     * turn may be appended as messages). Forks inherit it.
     */
    this._chat = parent ? parent._chat : null;
    /** A select runs on this line (its options are scored in forks). */
    this._selecting = false;
    /** release() was called (the branch is freed at the next step, once no child waits on it). */
    this._released = false;
    /** The branch was given back: nothing more happens on this line. */
    this._freed = false;
    /** The line's id in the scheduler's events (`p1.0`, `p1.1`, ...). */
    this._id = program.lineId();
    program.emit('fork', { branch: this._id, parent: parent ? parent._id : null, at: parent ? this._anchor : 0 });
  }

  /** The line's text: what was appended as text and what gen produced, in order. */
  get text() {
    return this._text;
  }

  /** Every token of the line (prompt, generated and appended), in order. */
  get tokens() {
    return this._tokens.slice();
  }

  /** Whether release() was called or the program ended. */
  get released() {
    return this._released || this._freed;
  }

  /**
   * Appends prompt text (tokenized now, without special tokens except the BOS of a program's
   * first text), token ids, or chat messages. Messages on an empty line are rendered with the
   * model's chat template up to the assistant's turn (its end-of-turn strings then stop every gen
   * of the line and its forks); on a line that started so, after the assistant's reply, they are
   * the next turn (the turn separator, then the messages rendered alone: nothing is decoded
   * again). Nothing is decoded until the line next needs its KV: a gen, or a fork's first step.
   * Returns the line, for chaining.
   * @param {string | number[] | readonly import('./types').ChatMessage[]} input
   * @returns {this}
   */
  append(input) {
    this._checkIdle('append');
    const ctx = this._program.ctx;
    const before = this._text.length;
    let tokens;
    if (Array.isArray(input) && input.length > 0 && input.every((m) => m !== null && typeof m === 'object')) {
      tokens = this._tokens.length === 0 ? this._firstTurn(input) : this._laterTurn(input);
      this._chat = 'open';
    } else if (typeof input === 'string') {
      tokens = input === '' ? [] : ctx.tokenizeSync(input, this._tokens.length === 0);
      this._text += input;
      if (this._chat === 'open' && input !== '') this._chat = 'replied'; // the assistant's text
    } else if (Array.isArray(input) && input.every((t) => Number.isInteger(t) && t >= 0 && t < ctx.vocabSize)) {
      tokens = input.slice();
      this._text += tokens.map((t) => ctx.tokenToText(t)).join('');
      if (this._chat === 'open' && tokens.length > 0) this._chat = 'replied';
    } else {
      throw invalid(`append(input): input must be a string or an array of token ids in [0, ${ctx.vocabSize})`);
    }
    this._tokens.push(...tokens);
    this._pending.push(...tokens);
    if (this._program.events.on) {
      const text = this._text.slice(before);
      this._program.emit('append', { branch: this._id, text: clipped(text), n: this._tokens.length });
    }
    return this;
  }

  /** The conversation's start: rendered up to the assistant's turn, with the BOS. */
  _firstTurn(messages) {
    const ctx = this._program.ctx;
    const formatted = ctx.formatChatSync(messages);
    this._text += formatted.prompt;
    this._stops = formatted.stopTokens.filter((s) => s !== '');
    return ctx.tokenizeSync(formatted.prompt, true);
  }

  /**
   * A later turn, after the assistant's reply: the turn separator (what closes the assistant's
   * turn; the part of it the reply already ended with is not repeated), then the new messages
   * rendered alone, as they appear after an earlier exchange (an empty system message first
   * makes the template render them so). Nothing before is decoded again.
   */
  _laterTurn(messages) {
    const ctx = this._program.ctx;
    if (this._chat === null)
      throw invalid('append(messages): this line did not start with chat messages; append text or tokens to it');
    if (this._chat === 'open')
      throw invalid('append(messages): the assistant turn is open; gen its reply (or append its text) first');
    const separator = ctx.getTurnSeparator();
    let done = Math.min(separator.length, this._tokens.length);
    while (done > 0 && !separator.slice(0, done).every((t, i) => t === this._tokens[this._tokens.length - done + i]))
      done--;
    const rest = separator.slice(done);
    const turn = ctx.formatChatSync([{ role: 'system', content: '' }, ...messages]).prompt;
    this._text += rest.map((t) => ctx.tokenToText(t)).join('') + turn;
    return [...rest, ...ctx.tokenizeSync(turn, false)];
  }

  /**
   * Generates after the line's text and appends the result to it. The tokens are sampled in the
   * scheduler's steps, one per step, in the same decode as everything else that runs.
   * @param {import('./types').ProgramGenOptions} [options]
   * @returns {Promise<import('./types').ProgramGenResult>}
   */
  async gen(options = {}) {
    this._checkIdle('gen');
    if (options === null || typeof options !== 'object') throw invalid('gen(options?): options must be an object');
    if (this._tokens.length === 0) throw invalid('gen(): the line is empty; append a prompt first');
    const program = this._program;
    const { params, seed, grammar } = checkSampling(options);
    const choices = options.choices === undefined ? null : choicesGrammar(options.choices);
    const constraints = [grammar, options.jsonSchema, choices, options.regex].filter(
      (c) => c !== undefined && c !== null,
    );
    if (constraints.length > 1) throw invalid('gen: give one of grammar, jsonSchema, choices or regex');
    if (options.regex !== undefined && (typeof options.regex !== 'string' || options.regex === ''))
      throw invalid('gen: regex must be a non-empty string (a JavaScript-style regular expression source)');
    const job = {
      maxTokens: positiveInt(options.maxTokens, 'options.maxTokens', program.defaultMaxTokens),
      matcher: new StopMatcher([...checkStops(options.stop), ...this._stops]),
      params: { ...params, seed: seed === undefined || seed === -1 ? program.nextSeed() : seed },
      grammar: grammar || choices,
      tokens: [],
      logprobs: checkLogprobs(options.logprobs, 'options.logprobs'),
      tokenLogprobs: [],
      started: false,
      resolve: null,
      reject: null,
    };
    const done = new Promise((resolve, reject) => {
      job.resolve = resolve;
      job.reject = reject;
    });
    this._job = job; // the line is busy from now on, even while a JSON schema converts
    try {
      if (options.jsonSchema !== undefined) job.grammar = await program.jsonSchemaToGrammar(options.jsonSchema);
      if (options.regex !== undefined) job.grammar = await regexGrammar(options.regex, program.jsonSchemaToGrammar);
    } catch (e) {
      this._job = null;
      throw e;
    }
    if (this._job !== job) throw program.endedError(); // the program ended meanwhile
    program.wake();
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
    this._checkIdle('fork');
    positiveInt(n, 'fork(n): n', 1);
    this._program.reserveLines(n);
    return this._spawn(n);
  }

  /**
   * Scores each option as the continuation of the line's text and appends the best. Options are
   * scored in forks, as scored prefill entries (a logits row per token) in the scheduler's steps,
   * beside everything else it runs; a token several options share is scored once (the options form a
   * trie: a fork per leaf, the forks of a shared prefix made where the options part, a step later
   * for each level of parting). The winner's fork becomes the line's KV, so its tokens are not
   * decoded again (unless the winner is a prefix of another option: its fork went on past it).
   * `method`: `'total'` (the sum of the tokens' log-probabilities, default), `'normalized'` (the
   * mean per token) or `'unconditional'` (the sum minus the option's sum after only the BOS token:
   * how much the line's text raises it). The forks count against `maxBranches` while they score (one
   * per option that is not a prefix of another; twice as many for `'unconditional'`).
   * @param {string[]} options
   * @param {{ method?: 'total' | 'normalized' | 'unconditional' }} [settings]
   * @returns {Promise<import('./types').SelectResult>}
   */
  async select(options, settings = {}) {
    this._checkIdle('select');
    const ctx = this._program.ctx;
    if (!Array.isArray(options) || options.length === 0 || !options.every((o) => typeof o === 'string' && o !== ''))
      throw invalid('select(options): options must be a non-empty array of non-empty strings');
    const method = settings && settings.method !== undefined ? settings.method : 'total';
    if (!['total', 'normalized', 'unconditional'].includes(method))
      throw invalid(`select: method must be 'total', 'normalized' or 'unconditional', got ${JSON.stringify(method)}`);
    if (this._tokens.length === 0) throw invalid('select(): the line is empty; append a prompt first');
    const tokens = options.map((o) => ctx.tokenizeSync(o, false));
    if (tokens.some((t) => t.length === 0)) throw invalid('select: an option tokenized to nothing');
    const bos = method === 'unconditional' ? ctx.tokenizeSync('', true) : [];
    if (method === 'unconditional' && bos.length === 0)
      throw makeError('ERR_UNSUPPORTED', "select: method 'unconditional' needs a model with a BOS token");
    const paths = scoringPaths(tokens);
    this._program.reserveLines(paths.length * (method === 'unconditional' ? 2 : 1));
    this._selecting = true;
    const scorers = this._scorePaths(paths, tokens, null);
    const unconditional = bos.length > 0 ? this._scorePaths(paths, tokens, bos) : null;
    try {
      const [sums, base] = await Promise.all([scorers.sums, unconditional && unconditional.sums]);
      const scores = sums.map((sum, i) => {
        if (method === 'normalized') return sum / tokens[i].length;
        return base ? sum - base[i] : sum;
      });
      const index = scores.reduce((best, s, i) => (s > scores[best] ? i : best), 0);
      this._selecting = false;
      const adopted = this._adopt(scorers.leafOf(index));
      this.append(options[index]);
      if (adopted) this._pending = []; // in the KV already: the branch came from the winner's fork
      return { choice: options[index], index, scores };
    } finally {
      this._selecting = false;
      for (const line of [...scorers.lines, ...(unconditional ? unconditional.lines : [])]) line.release();
    }
  }

  /**
   * Starts scoring `paths` (see scoringPaths): a line per path, forked from this line (or, with
   * `bos`, from a fresh line holding only it) or from its parent path's line where the options
   * part. Returns the lines, the options' sums (a promise) and `leafOf(option)`: the line whose
   * KV ends exactly after the option, if one does.
   */
  _scorePaths(paths, tokens, bos) {
    const program = this._program;
    const base = bos || this._tokens; // what every scoring line holds before its options' tokens
    const lines = [];
    for (const path of paths) {
      if (path.parent === null) {
        lines.push(bos ? program.freshLine(bos) : this._spawn(1)[0]);
        continue;
      }
      // Forked ahead: the parent path's line reaches this fork point once it has scored that far.
      const [option] = path.ends[0];
      lines.push(lines[path.parent]._spawn(1, [...base, ...tokens[option].slice(0, path.depth)])[0]);
    }
    const scored = Promise.all(lines.map((line, i) => line._score(paths[i].tokens)));
    const sums = scored.then((perPath) => {
      const logprobAt = (p, depth) =>
        depth >= paths[p].depth ? perPath[p][depth - paths[p].depth] : logprobAt(paths[p].parent, depth);
      const out = tokens.map(() => 0);
      for (const [p, path] of paths.entries()) {
        for (const [option, end] of path.ends) for (let d = 0; d < end; d++) out[option] += logprobAt(p, d);
      }
      return out;
    });
    const leafOf = (option) => {
      const p = paths.findIndex((path) =>
        path.ends.some(([o, end]) => o === option && end === path.depth + path.tokens.length),
      );
      return p < 0 ? null : lines[p];
    };
    return { lines, sums, leafOf };
  }

  /**
   * The winner's scoring line holds this line's tokens and then exactly the winner's, with the
   * logits after its last: the two swap branches (the scorer then frees this line's old one), so
   * the winner, appended next, need not be decoded again. False when that cannot be (no such
   * line, it is not in a state to give its branch, or a fork of this line still waits to fork it
   * where it is): the appended winner is then decoded by the line's next use.
   */
  _adopt(winner) {
    if (!winner || !winner._branch || winner._pending.length > 0 || winner._dependents > 0) return false;
    // Forks of this line still waiting for its branch fork it at their anchor, before the winner
    // (forkAt there would decode a token again, and is refused past a sliding window).
    if (!this._branch || this._pending.length > 0 || this._dependents > 0 || this.released) return false;
    [this._branch, winner._branch] = [winner._branch, this._branch];
    return true;
  }

  /**
   * The natural-log probability of `text` (or token ids) as the line's continuation; the line
   * does not change. One token is read from the logits the line holds once its pending tokens
   * are decoded (no extra decode), with the `top` (0..20) most likely next tokens; several are
   * scored in a fork as `select` does (the fork counts against `maxBranches`).
   * @param {string | number[]} text
   * @param {{ top?: number }} [options]
   * @returns {Promise<{ logprob: number, top: import('./types').TopLogprob[] }>}
   */
  async logprob(text, options = {}) {
    this._checkIdle('logprob');
    const ctx = this._program.ctx;
    const tokens = typeof text === 'string' ? ctx.tokenizeSync(text, false) : text;
    if (
      !Array.isArray(tokens) ||
      tokens.length === 0 ||
      !tokens.every((t) => Number.isInteger(t) && t >= 0 && t < ctx.vocabSize)
    )
      throw invalid(`logprob(text): give a non-empty string or token ids in [0, ${ctx.vocabSize})`);
    if (this._tokens.length === 0) throw invalid('logprob(): the line is empty; append a prompt first');
    const top = checkLogprobs((options && options.top) || 0, 'options.top');
    if (tokens.length === 1) {
      return new Promise((resolve, reject) => {
        this._job = { peek: tokens[0], top, resolve, reject, started: true, tokens: [] };
        this._program.wake();
      });
    }
    this._program.reserveLines(1);
    this._selecting = true;
    const [scorer] = this._spawn(1);
    try {
      const logprobs = await scorer._score(tokens);
      return { logprob: logprobs.reduce((a, b) => a + b, 0), top: [] };
    } finally {
      this._selecting = false;
      scorer.release();
    }
  }

  /**
   * The natural-log probabilities of several candidate next tokens, all read from the one logits
   * row the line holds once its pending tokens are decoded (no extra decode; the line does not
   * change): e.g. single-token answer labels. The values are log-softmax over the whole vocabulary,
   * in the order given.
   * @param {number[]} tokens token ids
   * @returns {Promise<number[]>}
   */
  async logprobs(tokens) {
    this._checkIdle('logprobs');
    const ctx = this._program.ctx;
    if (
      !Array.isArray(tokens) ||
      tokens.length === 0 ||
      !tokens.every((t) => Number.isInteger(t) && t >= 0 && t < ctx.vocabSize)
    )
      throw invalid(`logprobs(tokens): give a non-empty array of token ids in [0, ${ctx.vocabSize})`);
    if (this._tokens.length === 0) throw invalid('logprobs(): the line is empty; append a prompt first');
    return new Promise((resolve, reject) => {
      this._job = { peek: tokens[0], peeks: tokens.slice(), top: 0, resolve, reject, started: true, tokens: [] };
      this._program.wake();
    });
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
    this._checkIdle('decide');
    return decideOnLine(this, this._program.ctx, questions, options);
  }

  /** A peek (single-token `logprob`, or `logprobs`): read from the logits the line now holds. */
  _peek() {
    const job = this._job;
    this._job = null;
    try {
      if (job.peeks) {
        // One copy of the row and one log-sum-exp for all the tokens asked about.
        const row = this._branch.getLogits();
        let max = -Infinity;
        for (let i = 0; i < row.length; i++) if (row[i] > max) max = row[i];
        let sum = 0;
        for (let i = 0; i < row.length; i++) sum += Math.exp(row[i] - max);
        const lse = max + Math.log(sum);
        job.resolve(job.peeks.map((t) => row[t] - lse));
        return;
      }
      const { logprob, top } = this._branch.logprob(job.peek, job.top);
      job.resolve({ logprob, top });
    } catch (e) {
      job.reject(e);
    }
  }

  /**
   * `n` children of this line (or fresh lines when it is empty); leases were reserved. `at`:
   * the children's tokens, when they fork the line further on than it is now (where it will be
   * once it has decoded that far: a `select` path forked ahead).
   */
  _spawn(n, at = this._tokens) {
    const program = this._program;
    const children = [];
    for (let i = 0; i < n; i++) {
      const fresh = this._tokens.length === 0;
      const child = new ProgramLine(program, fresh ? null : this, at.slice());
      child._text = this._text;
      if (!fresh) this._dependents++;
      program.lines.push(child);
      children.push(child);
    }
    return children;
  }

  /**
   * Appends `tokens` to the line and resolves with their log-probabilities, one per token: they
   * are prefilled as a scored entry (a logits row per token), in the same decode as every other
   * line's and request's prefill of the step.
   * @returns {Promise<number[]>}
   */
  _score(tokens) {
    return new Promise((resolve, reject) => {
      this._tokens.push(...tokens);
      this._pending.push(...tokens);
      this._job = { score: tokens.length, scored: [], resolve, reject, started: true, tokens: [] };
      this._program.wake();
    });
  }

  /**
   * Where the scored tokens start in this step's prefill entry (the line's first `take` pending
   * tokens), or undefined when the entry holds none: the scored tokens are the last
   * `job.score` pending ones (a forkAt fork re-decodes one token before them).
   */
  _scoreFrom(take) {
    const job = this._job;
    if (!job || job.score === undefined) return undefined;
    const start = this._pending.length - job.score;
    return start < take ? start : undefined;
  }

  /**
   * Gives the line's branch back at the next step (a gen in flight rejects with ERR_ABORTED).
   * Idempotent. Everything a program holds is released when it returns anyway.
   */
  release() {
    if (this._released || this._freed) return;
    this._released = true;
    this._program.emit('prune', { branch: this._id });
    if (this._job) this._endJob(null, makeError('ERR_ABORTED', 'the line was released while it generated'));
    if (this._parent) {
      this._parent._dependents--; // it will never fork the parent now
      this._parent = null;
    }
    this._program.wake();
  }

  _checkIdle(op) {
    if (this._program.state !== 'running') throw this._program.endedError();
    if (this.released) throw schedulerError(Code.PROGRAM_STATE, `${op}(): this line was released; use another line`);
    if (this._job || this._selecting)
      throw schedulerError(Code.PROGRAM_STATE, `${op}(): a gen or select is running on this line; await it first`);
  }

  // -------------------------------------------------------------------------------------------
  // What the Scheduler calls, between and within its steps.

  /** Whether the line needs its KV now: a gen runs on it, or a child waits to fork it. */
  get _needed() {
    // (A released line with children still to fork it is needed until they have.)
    return !this._freed && (this._job !== null || this._dependents > 0);
  }

  /** Tokens in the branch's KV. */
  get _filled() {
    return this._tokens.length - this._pending.length;
  }

  /**
   * Gives a needed line its branch: a fork of its parent once the parent's KV reaches the
   * anchor; a fresh line forks the longest cached prompt prefix, or starts empty. Returns
   * whether the line has a branch now.
   */
  _materialize(cache, createBranch, spareLease) {
    if (this._branch) return true;
    if (!this._needed) return false;
    // Lines released this step still hold their leases until the next step frees them: wait
    // rather than take more than the program declared (and was admitted with).
    if (this._program.leasesHeld >= this._program.maxBranches) return false;
    const parent = this._parent;
    if (parent) {
      if (!parent._branch || parent._filled < this._anchor) return false;
      if (parent._filled === this._anchor) {
        this._branch = parent._branch.fork();
      } else {
        // The parent went on past the fork point: take its KV up to one token before it and
        // decode that token again, for the logits at the fork point.
        this._branch = parent._branch.forkAt(this._anchor - 1);
        this._pending.unshift(parent._tokens[this._anchor - 1]);
      }
      parent._dependents--;
      this._parent = null;
    } else {
      const cached = this._forkCached(cache);
      if (cached === WAIT) return false;
      this._branch = cached || this._openCacheEntry(cache, createBranch(), spareLease);
    }
    this._program.leasesHeld++;
    return true;
  }

  /**
   * A fresh line's prompt becomes a cache entry while the line fills it (when a lease is free
   * beyond every reservation, for the entry to keep once filled), so that programs and
   * requests starting with the same text fork it instead of prefilling it again.
   */
  _openCacheEntry(cache, branch, spareLease) {
    if (this._job && this._job.score !== undefined) return branch; // a BOS + option to score: nobody's prompt
    if (this._pending.length >= MIN_PARTIAL_REUSE && spareLease()) {
      this._segment = cache.pin(cache.open(this._pending.slice(), branch));
    }
    return branch;
  }

  /** The cache entry is filled: the cache keeps that branch, the line goes on in a fork of it. */
  _cacheFilled(cache) {
    const entry = this._segment;
    this._segment = null;
    cache.unpin(entry);
    try {
      this._branch = entry.branch.fork();
      cache.filled(entry);
    } catch {
      cache.forget(entry); // no lease after all: the line keeps the branch, nothing is cached
    }
  }

  /** An unfilled cache entry of this line leaves the cache (the line frees its branch itself). */
  _dropSegment(cache) {
    if (!this._segment) return;
    cache.unpin(this._segment);
    cache.forget(this._segment);
    this._segment = null;
  }

  /** A fork of the longest cached prefix of the line's tokens (never all but logits-less). */
  _forkCached(cache) {
    // Tokens to score must be decoded by the line itself (their logits rows are the score); the
    // first of them is scored from the logits at the fork point, which a partial fork lacks.
    const scored = this._job && this._job.score !== undefined ? this._job.score : 0;
    const start = cache.bestStart(this._pending.slice(0, this._pending.length - scored));
    const { entry } = start;
    if (!entry) return null;
    const length = start.partial ? Math.min(start.length, this._pending.length - 1 - scored) : start.length;
    if (length <= 0) return null;
    // Another line or request is filling this prompt: fork it once it is filled that far.
    if (!entry.ready && entry.branch.position < length) return WAIT;
    cache.unpin(cache.pin(entry)); // refreshes its place in the LRU order
    const branch = start.partial ? entry.branch.forkAt(length) : entry.branch.fork();
    this._pending = this._pending.slice(length);
    this._program.usage.cachedPromptTokens += length;
    return branch;
  }

  /** Whether the line's pending tokens should be prefilled this step. */
  get _wantsPrefill() {
    return this._branch !== null && this._needed && this._pending.length > 0;
  }

  /**
   * Where a scoring line's prefill stops this step: the next point where a line forked ahead of
   * it (a `select` path where options part) waits to fork it, so that the fork takes the KV and
   * logits there instead of decoding a token again (forkAt, refused past a sliding window).
   * Infinity when none waits; `_filled` when one waits right there (for a lease a line released
   * this step still holds): the line then holds still for a step.
   */
  _nextForkPoint() {
    let at = Infinity;
    if (this._dependents === 0) return at;
    for (const line of this._program.lines) {
      if (line._parent === this && !line._branch && line._needed && line._anchor >= this._filled)
        at = Math.min(at, line._anchor);
    }
    return at;
  }

  /** `count` pending tokens are in the KV now (`logprobs`: the scored ones'); returns `count`. */
  _prefilled(count, cache, logprobs) {
    const from = this._scoreFrom(count);
    const scored = from === undefined ? null : this._pending.slice(from, count);
    this._pending = this._pending.slice(count);
    this._program.cellsUsed += count;
    this._program.usage.promptTokens += count;
    if (this._segment && this._pending.length === 0) this._cacheFilled(cache);
    if (scored) this._scored(scored, logprobs);
    return count;
  }

  /** Whether the line samples this step. */
  get _decoding() {
    return this._job !== null && this._branch !== null && this._pending.length === 0;
  }

  /**
   * Before the line's first sample of a gen: its sampler gets the gen's params and grammar.
   * Returns false (and fails the gen through `fail`) when they are refused.
   */
  _arm(fail) {
    const job = this._job;
    if (job.started) return true;
    try {
      this._branch.setSamplerParams(job.params);
      // setSamplerParams keeps a grammar it is not given: an earlier gen's (complete) grammar
      // would allow nothing but end-of-generation.
      this._branch.setGrammar(job.grammar || null);
    } catch (e) {
      fail(e);
      return false;
    }
    job.started = true;
    return true;
  }

  /** Takes a produced token into the gen; true when it is to be committed (decoded) now. */
  _take(produced) {
    const job = this._job;
    if (produced.isStop) {
      this._endJob('stop');
      return false;
    }
    job.tokens.push(produced.token);
    job.matcher.push(produced.text);
    if (this._program.events.on) {
      const n = this._tokens.length + 1; // the sampled token is not committed yet
      this._program.emit('token', { branch: this._id, text: produced.text, n, ppl: perplexityOf(this._branch) });
    }
    if (job.logprobs !== undefined) job.tokenLogprobs.push(tokenLogprob(this._branch, produced, job.logprobs));
    this._program.usage.completionTokens++;
    const reason = job.matcher.stopped ? 'stop' : job.tokens.length >= job.maxTokens ? 'length' : null;
    if (!reason) return true;
    // Nothing is sampled after the last token now: it waits in `_pending` for the line's next use.
    this._tokens.push(produced.token);
    this._pending.push(produced.token);
    this._endJob(reason);
    return false;
  }

  /** Scored `tokens` were prefilled with these `logprobs`; the score resolves after the last. */
  _scored(tokens, logprobs) {
    const job = this._job;
    job.scored.push(...logprobs);
    job.score -= tokens.length;
    if (this._program.events.on) {
      const text = tokens.map((t) => this._program.ctx.tokenToText(t)).join('');
      this._program.emit('token', { branch: this._id, text, n: this._filled, forced: true });
    }
    if (job.score > 0) return;
    this._job = null;
    job.resolve(job.scored);
  }

  /** The token `_take` kept is in the KV now. */
  _committed(token) {
    this._tokens.push(token);
    this._program.cellsUsed++;
  }

  /** Settles the gen in flight: with `reason` as its finishReason, or rejected with `error`. */
  _endJob(reason, error) {
    const job = this._job;
    if (!job) return;
    this._job = null;
    // A prompt nobody will finish filling must not keep others waiting to fork it.
    if (this._segment && !this._needed) this._dropSegment(this._program.cache);
    if (error) {
      job.reject(error);
      return;
    }
    job.matcher.flush();
    const text = job.matcher.text;
    this._text += text;
    if (this._program.events.on)
      this._program.emit('finish', {
        branch: this._id,
        reason,
        n: this._tokens.length,
        ppl: perplexityOf(this._branch),
      });
    if (this._chat === 'open') this._chat = 'replied';
    const result = { text, tokens: job.tokens, finishReason: reason };
    if (job.logprobs !== undefined) result.logprobs = job.tokenLogprobs;
    job.resolve(result);
  }

  /**
   * Gives the branch back (when no child still waits to fork it, unless `force`); the prune's
   * promise goes into `prunes`.
   */
  _free(force, prunes) {
    if (this._freed || (!force && this._dependents > 0)) return;
    this._dropSegment(this._program.cache);
    if (this._job) this._endJob(null, this._program.endedError());
    this._freed = true;
    if (this._branch) {
      if (!this._branch.disposed) prunes.push(this._branch.prune().catch(() => {}));
      this._branch = null;
      this._program.leasesHeld--;
    }
    this._parent = null;
  }
}

module.exports = { ProgramLine };
