'use strict';

/**
 * Where a chat prompt's leading system/developer messages end, in tokens, so that requests
 * sharing a system prompt share a cached prefix that ends at a message boundary. Found as the
 * common token prefix of two renderings that differ only in the first user message; memoized
 * per leading-message set.
 */

const { tokenizeMarked } = require('./plain-text');

/** Roles whose leading messages are cached as their own prefix (the shared system prompt). */
const LEADING_ROLES = new Set(['system', 'developer']);
/** How many distinct leading-message sets keep their token boundary memoized. */
const MEMO_SIZE = 64;

class SystemPrompts {
  /** @param {import('../Context').SessionContext} ctx */
  constructor(ctx) {
    this._ctx = ctx;
    /** @type {Map<string, number[] | null>} */
    this._memo = new Map();
  }

  /**
   * The tokens of the leading system/developer messages as the chat template renders them before
   * any user turn, or null when there are none (or the template cannot render the probe).
   * `messages` as the request's prompt is rendered (client text marked: ./plain-text.js).
   * @param {{ role: string }[]} messages
   * @returns {Promise<number[] | null>}
   */
  async prefixOf(messages) {
    let count = 0;
    while (count < messages.length && messages[count] && LEADING_ROLES.has(messages[count].role)) count++;
    if (count === 0 || count === messages.length) return null;
    const lead = messages.slice(0, count);
    const key = JSON.stringify(lead);
    if (this._memo.has(key)) return this._memo.get(key);
    let prefix = null;
    try {
      const ctx = this._ctx;
      const render = async (content) =>
        tokenizeMarked(ctx, (await ctx.formatChat([...lead, { role: 'user', content }])).prompt, true);
      const a = await render('A');
      const b = await render('B');
      let k = 0;
      while (k < a.length && k < b.length && a[k] === b[k]) k++;
      prefix = k > 0 ? a.slice(0, k) : null;
    } catch {
      prefix = null; // a template that cannot render this shape: no boundary, still correct
    }
    if (this._memo.size >= MEMO_SIZE) this._memo.delete(this._memo.keys().next().value);
    this._memo.set(key, prefix);
    return prefix;
  }
}

module.exports = { SystemPrompts };
