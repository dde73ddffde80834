'use strict';

/**
 * Client text is text: a prompt, a message's content, a decision's state or question that spells
 * the model's control tokens (`<start_of_turn>`, `<|im_start|>`, …) is tokenized as plain text,
 * so it cannot close the user's turn and open the model's. The text around it that the chat
 * template (or the library) writes keeps its control tokens.
 *
 * How: a client string that spells a control token (the only kind whose tokens differ between
 * parsing special tokens and not) is wrapped in two markers (a per-process random nonce, letters
 * and digits only, so templates' `trim` and JSON escaping leave them alone) before it meets the
 * template; `tokenizeMarked` cuts the rendered text at the markers, tokenizes the template's text
 * with special tokens parsed and the client's span without, and concatenates the ids. Text that
 * spells no control token is never marked, so its tokens are exactly what they were (the whole
 * prompt tokenized at once). A marked span is tokenized on its own: at its two edges the tokenizer
 * cannot merge across the boundary as it would in one piece (documented in docs/serving.md).
 * `parseSpecial: true` (a Scheduler option) turns this off: every text is tokenized with special
 * tokens parsed, as before.
 */

const { randomBytes } = require('node:crypto');
const { makeError } = require('../errors');

const NONCE = randomBytes(12).toString('hex');
/** The markers around a client span (unguessable by a client, so it cannot close one itself). */
const OPEN = `LBtxtO${NONCE}O`;
const CLOSE = `LBtxtC${NONCE}C`;
const MARKS = new RegExp(`${OPEN}|${CLOSE}`, 'g');

/**
 * Characters of text whose {@link spellsSpecial} answer a context keeps (least recently used
 * out); each entry counts `SPELLS_ENTRY_CHARS` more for its map slot, so many short texts are
 * bounded too.
 */
const SPELLS_CACHE_CHARS = 4 * 1024 * 1024;
const SPELLS_ENTRY_CHARS = 64;
/** @type {WeakMap<object, { answers: Map<string, boolean>, chars: number }>} */
const spellsCache = new WeakMap();

/**
 * Whether `text` spells a control token of `ctx`'s vocabulary (its tokens differ when special
 * tokens are parsed). Remembered per context: a conversation sends its whole history again on
 * every turn, and each answer costs two synchronous tokenizations on the JS thread (which, on a
 * machine with few cores, also takes a core from the decode's threads).
 * @param {import('../Context').SessionContext} ctx
 * @param {string} text
 */
function spellsSpecial(ctx, text) {
  if (text === '') return false;
  let cache = spellsCache.get(ctx);
  if (!cache) spellsCache.set(ctx, (cache = { answers: new Map(), chars: 0 }));
  const known = cache.answers.get(text);
  if (known !== undefined) {
    cache.answers.delete(text); // most recently used last
    cache.answers.set(text, known);
    return known;
  }
  const parsed = ctx.tokenizeSync(text, false, true);
  const plain = ctx.tokenizeSync(text, false, false);
  const spells = parsed.length !== plain.length || parsed.some((t, i) => t !== plain[i]);
  if (text.length <= SPELLS_CACHE_CHARS / 4) {
    cache.answers.set(text, spells);
    cache.chars += text.length + SPELLS_ENTRY_CHARS;
    for (const old of cache.answers.keys()) {
      if (cache.chars <= SPELLS_CACHE_CHARS) break;
      cache.answers.delete(old);
      cache.chars -= old.length + SPELLS_ENTRY_CHARS;
    }
  }
  return spells;
}

/**
 * `text` as client text: unchanged when it spells no control token, else wrapped in the markers.
 * @param {import('../Context').SessionContext} ctx
 * @param {string} text
 */
function clientText(ctx, text) {
  if (typeof text !== 'string' || !spellsSpecial(ctx, text)) return text;
  return `${OPEN}${text}${CLOSE}`;
}

/**
 * A message's content as client text for a chat template: as {@link clientText}, but the markers
 * go inside its leading and trailing white space, which a template's `trim` may still remove.
 * @param {import('../Context').SessionContext} ctx
 * @param {string} text
 */
function clientContent(ctx, text) {
  if (typeof text !== 'string' || !spellsSpecial(ctx, text)) return text;
  const lead = /^\s*/.exec(text)[0];
  const trail = /\s*$/.exec(text.slice(lead.length))[0];
  return `${lead}${OPEN}${text.slice(lead.length, text.length - trail.length)}${CLOSE}${trail}`;
}

/** A content's text parts marked (all of them when their joined text spells a control token). */
function markContent(ctx, content) {
  if (typeof content === 'string') return clientContent(ctx, content);
  if (!Array.isArray(content)) return content;
  const texts = content.filter((p) => p && typeof p === 'object' && typeof p.text === 'string');
  if (!spellsSpecial(ctx, texts.map((p) => p.text).join(''))) return content;
  return content.map((p) => (texts.includes(p) ? { ...p, text: `${OPEN}${p.text}${CLOSE}` } : p));
}

/**
 * Chat messages with their client text marked: each message's content (a string, or its text
 * parts) and reasoning. Tool calls' arguments (JSON text the template parses) and names are not.
 * Returns `messages` itself when nothing needed a mark.
 * @template T
 * @param {import('../Context').SessionContext} ctx
 * @param {T[]} messages
 * @returns {T[]}
 */
function markMessages(ctx, messages) {
  let changed = false;
  const out = messages.map((m) => {
    if (m === null || typeof m !== 'object') return m;
    const copy = /** @type {any} */ ({ ...m });
    for (const key of ['content', 'reasoning_content', 'reasoningContent']) {
      if (!(key in copy)) continue;
      copy[key] = key === 'content' ? markContent(ctx, copy[key]) : clientContent(ctx, copy[key]);
      if (copy[key] !== /** @type {any} */ (m)[key]) changed = true;
    }
    return copy;
  });
  return changed ? out : messages;
}

/** Whether `text` holds marked client text (or half a mark: refused by tokenizeMarked). */
const isMarked = (text) => typeof text === 'string' && (text.includes(OPEN) || text.includes(CLOSE));

/** `text` without the markers (what it reads as: for traces and events). */
const unmark = (text) => (isMarked(text) ? text.replace(MARKS, '') : text);

/**
 * The tokens of `text`: special tokens parsed, except in marked client spans, tokenized as plain
 * text. Text without marks is tokenized whole, as `ctx.tokenizeSync` does. Throws ERR_INVALID_ARG
 * when the marks do not pair up (a template that rewrote client text it was given).
 * @param {import('../Context').SessionContext} ctx
 * @param {string} text
 * @param {boolean} addSpecial the model's BOS before the text
 * @returns {number[]}
 */
function tokenizeMarked(ctx, text, addSpecial) {
  if (!isMarked(text)) return ctx.tokenizeSync(text, addSpecial);
  const out = addSpecial ? ctx.tokenizeSync('', true) : [];
  let at = 0;
  for (;;) {
    const open = text.indexOf(OPEN, at);
    const head = open < 0 ? text.slice(at) : text.slice(at, open);
    if (head.includes(CLOSE)) throw unpaired();
    if (head !== '') out.push(...ctx.tokenizeSync(head, false, true));
    if (open < 0) return out;
    const start = open + OPEN.length;
    const close = text.indexOf(CLOSE, start);
    if (close < 0 || text.slice(start, close).includes(OPEN)) throw unpaired();
    const span = text.slice(start, close);
    if (span !== '') out.push(...ctx.tokenizeSync(span, false, false));
    at = close + CLOSE.length;
  }
}

function unpaired() {
  return makeError(
    'ERR_INVALID_ARG',
    "text that spells the model's special tokens could not be kept as plain text through the chat template (the template rewrites it); remove the special-token text, or create the Scheduler with parseSpecial: true",
  );
}

module.exports = { spellsSpecial, clientText, clientContent, markMessages, tokenizeMarked, unmark };
