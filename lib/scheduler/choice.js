'use strict';

/**
 * One of a request's n choices, as its Generation sees it: the events of its tokens
 * (`{choice, token, text, logprob?, top?, delta?}`), then one ending event, and the choice the
 * result holds (text, tokens, finishReason, perplexity, logprobs, and a chat reply's content,
 * reasoning and tool calls). It is its gen's sink (./jobs.js), and the gen is its line's last
 * job (`endsLine`); a choice of a request that ended
 * before it began is ended 'abort' without one (./generation.js). Its `state`: 'generating', then 'ended'.
 */
class Choice {
  /**
   * @param {number} index
   * @param {(event: any) => void} push the request's Generation's
   * @param {import('./chat').ChatStream | null} chat the reply parsed as it grows, for a chat with tools or reasoning
   */
  constructor(index, push, chat) {
    this.state = 'generating';
    this.endsLine = true;
    this.index = index;
    this.push = push;
    this.chat = chat;
    /** Tokens generated so far (what the choice may still write is maxTokens minus these). */
    this.generated = 0;
    /** @type {any} the result's choice, once ended */
    this.result = null;
  }

  /** A token taken: its released `text`, log-probability and chat delta go out as one event. */
  token(token, text, lp, matcher) {
    this.generated++;
    /** @type {any} */
    const event = { choice: this.index, token, text };
    if (lp) {
      event.logprob = lp.logprob;
      event.top = lp.top;
    }
    if (this.chat) event.delta = text === '' ? null : this.chat.update(matcher.text.slice(0, matcher.released));
    this.push(event);
  }

  /**
   * The gen ended with `gen` (its text, tokens, finishReason, logprobs); `rest`: the text its stop
   * matcher held back until now; `perplexity`: its line's (Infinity: none). A chat reply is parsed
   * whole (a call's end: 'tool_calls'). Returns the result's choice.
   */
  end(gen, rest, perplexity = Infinity) {
    const { text, tokens, logprobs } = gen;
    let { finishReason } = gen;
    const chat = this.chat;
    let delta = null;
    let message = {};
    if (chat && finishReason !== 'abort') {
      delta = chat.finish(text);
      message = chat.message;
      if (chat.message.toolCalls.length > 0 && finishReason === 'stop') finishReason = 'tool_calls';
    }
    const ending = { choice: this.index, token: null, text: rest, finishReason };
    this.push(chat ? { ...ending, delta, message: chat.message } : ending);
    this.result = { text, tokens, finishReason, perplexity, ...(logprobs ? { logprobs } : {}), ...message };
    this.state = 'ended';
    return this.result;
  }
}

module.exports = { Choice };
