'use strict';

/**
 * What a line (./line.js) can be asked to do, one job at a time:
 *
 *   GenJob    sample a token per step: stops, maxTokens, log-probabilities, drafts
 *   ScoreJob  prefill tokens as a scored entry (a logits row each) and resolve their log-probabilities
 *   PeekJob   read log-probabilities from the logits the line holds (no decode)
 *   MoveJob   park the line's branch, or resume it (between a step's decodes)
 *
 * Its `kind` says how the Scheduler's steps serve it ('gen': a row of the decode phase; 'score':
 * its tokens prefilled with a logits row each; 'peek': read once the line's KV is in; 'move':
 * parked or resumed right after the step frees released lines), and each job settles its own
 * promise (`finish` with an error rejects it).
 */

const { StopMatcher } = require('./stops');
const { DraftLength } = require('../decode/speculation');

/** A promise and the functions that settle it. */
function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve: /** @type {any} */ (resolve), reject: /** @type {any} */ (reject) };
}

/**
 * Where a gen's tokens and end go: a program's line (`LINE_SINK`: the result is the gen's own) or
 * a request's `Choice` (./choice.js). `endsLine`: the gen is its line's last job, so its last
 * token goes into the branch (perplexity counts it) and the branch goes back as it ends; else
 * that token stays pending for the line's next use.
 * @typedef {{ endsLine: boolean, token: (token: number, text: string, lp: any, matcher: StopMatcher) => void,
 *   end: (result: any, rest: string, perplexity: number) => any }} GenSink
 */

/** @type {GenSink} */
const LINE_SINK = { endsLine: false, token() {}, end: (result) => result };

/**
 * A gen: one token sampled per step until a stop, an end-of-generation token or maxTokens; every
 * token and the end go to its `sink`. Its `state`: 'waiting' (the line's sampler not set yet),
 * 'sampling', 'ended'.
 */
class GenJob {
  /**
   * @param {{ maxTokens: number, stops: string[], params: any, grammar: string | null, lazy?: any, logprobs?: number,
   *   sink?: GenSink }} options
   */
  constructor({ maxTokens, stops, params, grammar, lazy = null, logprobs, sink = LINE_SINK }) {
    /** @type {'gen'} */
    this.kind = 'gen';
    this.state = 'waiting';
    this.maxTokens = maxTokens;
    this.matcher = new StopMatcher(stops);
    this.params = params;
    this.grammar = grammar;
    /** Lazy-grammar triggers of a tool-call grammar (null: the grammar applies from the start). */
    this.lazy = lazy;
    /** Top alternatives per token when log-probabilities were asked for, else undefined. */
    this.logprobs = logprobs;
    this.tokenLogprobs = [];
    this.tokens = [];
    this.sink = sink;
    /** Speculating: the line's drafter and draft length, and the token verification sampled next. */
    this.drafter = null;
    this.draftLength = null;
    this.next = undefined;
    this.done = deferred();
  }

  /**
   * Before the first sample: the line's `branch` gets the gen's params and grammar (throws when
   * refused), and with `spec` (the scheduler speculates; log-probabilities need each token's own
   * snapshot, which a verified draft does not keep) a drafter opened on the line's `tokens`.
   */
  arm(branch, tokens, spec) {
    if (this.state !== 'waiting') return;
    branch.setSamplerParams(this.params);
    // setSamplerParams keeps a grammar it is not given: an earlier gen's (complete) grammar
    // would allow nothing but end-of-generation.
    branch.setGrammar(this.grammar || null, this.lazy || undefined);
    if (spec && this.logprobs === undefined) {
      this.drafter = spec.source.open(tokens);
      this.draftLength = new DraftLength(spec);
    }
    this.state = 'sampling';
  }

  /**
   * Takes a sampled (or accepted draft) token that is not end-of-generation: its text through the
   * stop matcher, its log-probability (from the logits of `branch` it was sampled from), to its
   * sink. Returns why the gen ends with it ('stop', 'length'), or null.
   */
  take(produced, branch) {
    this.next = undefined;
    this.tokens.push(produced.token);
    const text = this.matcher.push(produced.text);
    let lp = null;
    if (this.logprobs !== undefined) {
      const { logprob, top } = branch.logprob(produced.token, this.logprobs);
      this.tokenLogprobs.push((lp = { token: produced.token, text: produced.text, logprob, top }));
    }
    this.sink.token(produced.token, text, lp, this.matcher);
    return this.matcher.stopped ? 'stop' : this.tokens.length >= this.maxTokens ? 'length' : null;
  }

  /**
   * The gen ended on `token`, sampled but not decoded: true, it stays pending for the line's next
   * use; else (its sink `endsLine`) it goes into `branch` now, so the perplexity counts it.
   */
  keepsLast(token, branch) {
    if (!this.sink.endsLine) return true;
    try {
      branch.accept(token);
    } catch {
      // the perplexity then leaves it out; the text is complete either way
    }
    return false;
  }

  /** A speculative step verified `token` and took `accepted`: the drafter hears them; `next` is sampled already. */
  drafted(token, accepted, next) {
    this.drafter.accept([token, ...accepted.map((p) => p.token)]);
    this.next = next || undefined;
  }

  /** A grammar converted after the gen was made (a JSON schema, a regex): before it is armed. */
  setGrammar(grammar) {
    this.grammar = grammar;
  }

  /**
   * Ends the gen with `reason` and returns its sink's result (a request's choice's is its own,
   * e.g. a chat reply's calls ending 'tool_calls', with the line's `perplexity`), or rejects it
   * with `error`.
   */
  finish(reason, error, perplexity = Infinity) {
    this.state = 'ended';
    if (this.drafter) this.drafter.close();
    this.drafter = null;
    if (error) return void this.done.reject(error);
    const rest = this.matcher.flush(); // the events' texts add up to the result's text
    /** @type {any} */
    const result = { text: this.matcher.text, tokens: this.tokens, finishReason: reason };
    if (this.logprobs !== undefined) result.logprobs = this.tokenLogprobs;
    this.done.resolve(result);
    return this.sink.end(result, rest, perplexity);
  }
}

/** Scoring: the line's last `count` pending tokens are prefilled with a logits row each. */
class ScoreJob {
  constructor(count) {
    /** @type {'score'} */
    this.kind = 'score';
    /** Pending tokens still to score. */
    this.left = count;
    this.logprobs = [];
    this.done = deferred();
  }

  /** `tokens` were scored with these `logprobs`; true after the last (the job is done). */
  scored(tokens, logprobs) {
    this.logprobs.push(...logprobs);
    this.left -= tokens.length;
    if (this.left > 0) return false;
    this.done.resolve(this.logprobs);
    return true;
  }

  finish(_reason, error) {
    this.done.reject(error);
  }
}

/**
 * Log-probabilities read from the logits the line holds once its pending tokens are in (no
 * decode): one token with its `top` alternatives, or several candidate next tokens at once (one
 * copy of the row, one log-sum-exp for all of them).
 */
class PeekJob {
  /** @param {number | number[]} tokens @param {number} [top] */
  constructor(tokens, top = 0) {
    /** @type {'peek'} */
    this.kind = 'peek';
    this.tokens = tokens;
    this.top = top;
    this.done = deferred();
  }

  read(branch) {
    try {
      if (!Array.isArray(this.tokens)) {
        const { logprob, top } = branch.logprob(this.tokens, this.top);
        return void this.done.resolve({ logprob, top });
      }
      const row = branch.getLogits();
      let max = -Infinity;
      for (let i = 0; i < row.length; i++) if (row[i] > max) max = row[i];
      let sum = 0;
      for (let i = 0; i < row.length; i++) sum += Math.exp(row[i] - max);
      const lse = max + Math.log(sum);
      this.done.resolve(this.tokens.map((t) => row[t] - lse));
    } catch (e) {
      this.done.reject(e);
    }
  }

  finish(_reason, error) {
    this.done.reject(error);
  }
}

/**
 * A park (`to: 'parked'`: the branch gives back its lease and own cells, ../Branch.js `park`) or a
 * resume (`to: 'live'`) of the line, made by the step between its decodes; resolves once done.
 */
class MoveJob {
  /** @param {'parked' | 'live'} to */
  constructor(to) {
    /** @type {'move'} */
    this.kind = 'move';
    this.to = to;
    this.done = deferred();
  }

  moved() {
    this.done.resolve();
  }

  finish(_reason, error) {
    this.done.reject(error);
  }
}

module.exports = { GenJob, ScoreJob, PeekJob, MoveJob };
