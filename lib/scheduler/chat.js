'use strict';

/**
 * The chat side of a `scheduler.generate({ messages })` request: tools, tool choice and reasoning.
 * llama.cpp's chat layer (`formatChat`) renders the prompt with the tools and gives the grammar
 * that constrains a call (lazy, with its triggers, when the model may also answer in prose);
 * `parseChatOutput` splits each finished choice into content, reasoning and tool calls. Templates
 * that cannot render tools (Gemma 3's) get the shim's one generic JSON format. Nothing here knows
 * a model family.
 */

const { randomBytes } = require('node:crypto');
const { makeError } = require('../errors');
const { ChatFormat } = require('../constants');
const { tokenizeMarked, unmark } = require('./plain-text');
const { readToolCalls, readForcedCalls, forcedCallSchema } = require('./tool-calls');

/** Kinds of lazy-grammar triggers in a formatChat result (llama.cpp's common_grammar_trigger_type). */
const GrammarTriggerType = Object.freeze({ TOKEN: 0, WORD: 1, PATTERN: 2, PATTERN_FULL: 3 });

const CHAT_FIELDS = ['tools', 'toolChoice', 'parallelToolCalls', 'reasoningFormat', 'enableThinking'];
const TOOL_CHOICES = ['auto', 'none', 'required'];

function invalid(message) {
  return makeError('ERR_INVALID_ARG', message);
}

/** Checks one tool: `{ type: 'function', function: { name, description?, parameters? } }`. */
function checkTool(tool, i) {
  const where = `request.tools[${i}]`;
  if (tool === null || typeof tool !== 'object' || tool.type !== 'function')
    throw invalid(`${where} must be {type: 'function', function: {name, parameters}}; only function tools exist`);
  const fn = tool.function;
  if (fn === null || typeof fn !== 'object' || typeof fn.name !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(fn.name))
    throw invalid(`${where}.function.name must be 1-64 letters, digits, '_', '.' or '-'`);
  const params = fn.parameters;
  if (params !== undefined && params !== null && (typeof params !== 'object' || Array.isArray(params)))
    throw invalid(`${where}.function.parameters must be a JSON schema object`);
  if (params && params.type !== undefined && params.type !== 'object')
    throw invalid(`${where}.function.parameters must describe an object (type 'object'), got type ${params.type}`);
}

/**
 * The `formatChat` options of a request's chat fields (undefined when it has none), with a named
 * tool choice turned into `required` over that one tool. Throws ERR_INVALID_ARG.
 * @param {any} request
 */
function checkChat(request) {
  const given = CHAT_FIELDS.filter((k) => request[k] !== undefined && request[k] !== null);
  if (given.length === 0) return undefined;
  if (request.messages === undefined) throw invalid(`request.${given[0]} needs messages (a chat request)`);
  const options = {};
  let { tools, toolChoice } = request;
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) throw invalid('request.tools must be an array of function tools');
    tools.forEach(checkTool);
    if (tools.length > 0) options.tools = tools;
  }
  if (toolChoice !== undefined && toolChoice !== null) {
    if (typeof toolChoice === 'object') {
      const name = toolChoice.type === 'function' && toolChoice.function && toolChoice.function.name;
      const tool = typeof name === 'string' && (tools || []).find((t) => t.function.name === name);
      if (!tool)
        throw invalid(
          `request.toolChoice names function ${JSON.stringify(name)}, which is not in request.tools; give {type: 'function', function: {name}} of a declared tool`,
        );
      options.tools = [tool];
      toolChoice = 'required';
    } else if (!TOOL_CHOICES.includes(toolChoice)) {
      throw invalid(`request.toolChoice must be 'auto', 'none', 'required' or {type: 'function', function: {name}}`);
    }
    if (toolChoice === 'required' && !options.tools) throw invalid("request.toolChoice 'required' needs tools");
    options.toolChoice = toolChoice;
  }
  for (const flag of ['parallelToolCalls', 'enableThinking']) {
    if (request[flag] === undefined || request[flag] === null) continue;
    if (typeof request[flag] !== 'boolean') throw invalid(`request.${flag} must be a boolean`);
    options[flag] = request[flag];
  }
  if (request.reasoningFormat !== undefined && request.reasoningFormat !== null) {
    if (typeof request.reasoningFormat !== 'string') throw invalid('request.reasoningFormat must be a string');
    options.reasoningFormat = request.reasoningFormat;
  }
  return options;
}

/** A formatChat result's lazy-grammar triggers in `branch.setGrammar`'s shape. */
function lazyTriggers(formatted) {
  const lazy = { triggerWords: [], triggerPatterns: [], triggerTokens: [] };
  for (const t of formatted.grammarTriggers) {
    if (t.type === GrammarTriggerType.TOKEN && t.token >= 0) lazy.triggerTokens.push(t.token);
    else if (t.type === GrammarTriggerType.PATTERN) lazy.triggerPatterns.push(t.value);
    else if (t.type === GrammarTriggerType.PATTERN_FULL)
      lazy.triggerPatterns.push(`${t.value.startsWith('^') ? '' : '^'}${t.value}${t.value.endsWith('$') ? '' : '$'}`);
    else lazy.triggerWords.push(t.value);
  }
  return lazy;
}

/** An OpenAI-style call id (`call_` and 24 hex digits). */
function callId() {
  return `call_${randomBytes(12).toString('hex')}`;
}

/**
 * What a request's chat layer decided: the grammar to install (and whether lazily), and how each
 * finished choice is parsed.
 */
class ChatTurn {
  /**
   * @param {import('../Context').SessionContext} ctx
   * @param {any} formatted the formatChat result
   * @param {boolean} parse whether choices are parsed (tools given, or a reasoning format)
   * @param {{ tools: any[], forced: boolean } | null} calls the declared tools a reply may call
   *   beyond the template's syntax (./tool-calls.js); `forced`: the grammar is a bare call's
   */
  constructor(ctx, formatted, parse, calls = null) {
    this.ctx = ctx;
    /** The prompt's tokens (client text that was marked kept plain: ./plain-text.js), with the BOS. */
    this.tokens = tokenizeMarked(ctx, formatted.prompt, true);
    formatted.prompt = unmark(formatted.prompt);
    this.formatted = formatted;
    /** parseChatOutput's options for unfinished text: built once, used for every token. */
    this.partialOptions = { ...formatted, isPartial: true };
    this.parse = parse;
    this.grammar = formatted.grammar || null;
    this.lazy = formatted.grammarLazy ? lazyTriggers(formatted) : null;
    this.calls = calls;
  }

  /**
   * `{content, reasoningContent, toolCalls}` of a choice's text so far (`partial`) or finished;
   * null when unfinished text does not parse yet. Finished text the format's parser cannot read
   * (cut off by maxTokens) is all content.
   * @param {string} text
   * @param {boolean} partial
   */
  parseText(text, partial) {
    const calls = this.calls;
    if (calls && calls.forced) {
      // The grammar allows nothing but the call: shown once whole, or as text when cut off.
      const found = partial ? null : readForcedCalls(text, calls.tools);
      if (found) return { content: '', reasoningContent: '', toolCalls: found };
      return { content: partial ? '' : text, reasoningContent: '', toolCalls: [] };
    }
    const parsed = this.#parseTemplate(text, partial);
    if (!parsed || !calls || parsed.toolCalls.length > 0) return parsed;
    const read = readToolCalls(parsed.content, calls.tools, partial);
    return { ...parsed, content: read.content, toolCalls: read.calls };
  }

  #parseTemplate(text, partial) {
    try {
      const options = partial ? this.partialOptions : this.formatted;
      const { content, reasoningContent, toolCalls } = this.ctx.parseChatOutput(text, this.formatted.format, options);
      return { content, reasoningContent, toolCalls };
    } catch (e) {
      if (!e || e.code !== 'ERR_CHAT_PARSE') throw e;
      return partial ? null : { content: text, reasoningContent: '', toolCalls: [] };
    }
  }
}

/**
 * One choice's parsed message as its text grows: each update gives the delta since the last, the
 * way OpenAI streams one: content and reasoning as they grow; a tool call first with its id and
 * name (once the name is whole), then its arguments piece by piece as they arrive. The pieces of
 * a call concatenate to its final arguments (the chat layer's partial parse only grows them).
 */
class ChatStream {
  /** @param {ChatTurn} turn */
  constructor(turn) {
    this.turn = turn;
    this.content = '';
    this.reasoningContent = '';
    /** @type {string[]} each call's arguments sent so far */
    this.argumentsSent = [];
    /** @type {string[]} ids given to the calls in order, kept from update to update */
    this.ids = [];
    /** The last message parsed (the final one after `finish`). */
    this.message = { content: '', reasoningContent: '', toolCalls: [] };
  }

  /** The delta of the text so far (null: nothing new). */
  update(text) {
    return this.#advance(this.turn.parseText(text, true));
  }

  /** The delta of the finished text; `message` is then the whole parsed message. */
  finish(text) {
    return this.#advance(this.turn.parseText(text, false));
  }

  #advance(parsed) {
    if (!parsed) return null;
    parsed.toolCalls = parsed.toolCalls.map((c, i) => {
      if (!this.ids[i]) this.ids[i] = c.id || callId();
      return { id: this.ids[i], name: c.name, arguments: c.arguments };
    });
    this.message = parsed;
    /** @type {any} */
    const delta = {};
    const grown = (field) => {
      const now = parsed[field];
      if (now.length > this[field].length && now.startsWith(this[field])) {
        delta[field] = now.slice(this[field].length);
        this[field] = now;
      }
    };
    grown('content');
    grown('reasoningContent');
    const calls = [];
    parsed.toolCalls.forEach((c, index) => {
      const sent = this.argumentsSent[index];
      if (sent === undefined) {
        calls.push({ index, id: c.id, name: c.name, arguments: c.arguments });
        this.argumentsSent[index] = c.arguments;
      } else if (c.arguments.length > sent.length && c.arguments.startsWith(sent)) {
        calls.push({ index, arguments: c.arguments.slice(sent.length) });
        this.argumentsSent[index] = c.arguments;
      }
      // Otherwise nothing new. Arguments that stopped extending what was sent cannot be streamed
      // (a piece cannot be taken back); the chat layer's partial parsers only grow them (tested in
      // test/chat.test.js), and the finished message carries each call whole either way.
    });
    if (calls.length > 0) delta.toolCalls = calls;
    return Object.keys(delta).length ? delta : null;
  }
}

/**
 * Renders a request's messages (client text marked or not: ./plain-text.js) with its chat
 * options; the prompt, its tokens, stop strings and ChatTurn.
 * @param {import('../Context').SessionContext} ctx
 * @param {any[]} messages
 * @param {any} options from checkChat (undefined: none)
 */
async function formatTurn(ctx, messages, options) {
  const formatted = await ctx.formatChat(messages, options);
  const calling = Boolean(options && options.tools && options.toolChoice !== 'none');
  // Parsed only when there is something to split: calls, or a thinking section (a template
  // without one keeps plain chat off the per-token parse).
  const parse =
    calling || Boolean(options && (options.reasoningFormat || 'none') !== 'none' && formatted.supportsThinking);
  let calls = null;
  // The shim's generic format (templates that cannot render tools) parses its own calls.
  if (calling && formatted.format !== ChatFormat.GENERIC) {
    // A forced choice is a bare call object, its grammar ours: the template's grammar lets the
    // model write prose first (where Qwen2.5 writes its call as a fenced block, then spells out
    // the end-of-turn token it may not sample) and starts with the generation prompt.
    const forced = options.toolChoice === 'required';
    calls = { tools: options.tools, forced };
    if (forced) {
      formatted.grammar = await ctx.jsonSchemaToGrammar(
        forcedCallSchema(options.tools, options.parallelToolCalls === true),
      );
      formatted.grammarLazy = false;
    }
  }
  return new ChatTurn(ctx, formatted, parse, calls);
}

/**
 * A program line's first turn (`line.append(messages)` on an empty line): the prompt rendered up
 * to the assistant's turn, with the BOS, and the template's end-of-turn strings (the line's stops).
 * `messages` may hold marked client text (./plain-text.js).
 */
function firstTurn(ctx, messages) {
  const formatted = ctx.formatChatSync(messages);
  const stops = formatted.stopTokens.filter((s) => s !== '');
  return { tokens: tokenizeMarked(ctx, formatted.prompt, true), text: unmark(formatted.prompt), stops };
}

/**
 * A later turn of a program line, after the assistant's reply (the line's tokens `own`): the turn
 * separator (what closes the assistant's turn; the part of it the reply already ended with is not
 * repeated), then the new messages rendered alone, as they appear after an earlier exchange (an
 * empty system message first makes the template render them so). Nothing before is decoded again.
 */
function laterTurn(ctx, own, messages) {
  const separator = ctx.getTurnSeparator();
  let done = Math.min(separator.length, own.length);
  while (done > 0 && !separator.slice(0, done).every((t, i) => t === own[own.length - done + i])) done--;
  const rest = separator.slice(done);
  const turn = ctx.formatChatSync([{ role: 'system', content: '' }, ...messages]).prompt;
  const text = rest.map((t) => ctx.tokenToText(t)).join('') + unmark(turn);
  return { tokens: [...rest, ...tokenizeMarked(ctx, turn, false)], text };
}

module.exports = { checkChat, formatTurn, firstTurn, laterTurn, ChatTurn, ChatStream, callId, GrammarTriggerType };
