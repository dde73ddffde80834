'use strict';

/**
 * A `scheduler.generate()` request's prompt, prepared between the Scheduler's steps
 * (./request.js): the chat template or the raw prompt tokenized, images keyed (./media.js), the
 * cache points it is cut at, its gen's end-of-turn stops and grammar, and the check that it fits
 * the context — as the Budget its Program is admitted with (./program.js).
 */

const { invalid } = require('./checks');
const { formatTurn } = require('./chat');
const { spellsSpecial, markMessages } = require('./plain-text');
const { imagesOfPrompt } = require('./events');
const { hasImages, markImages, mediaPromptOf, imagesWithSpecialText } = require('./media');

/**
 * Tokenizes the prompt (messages: the chat template, on the context's worker), finds where it is
 * cut into cache entries, resolves the grammar into `gen` and checks that the request fits the
 * context. Resolves with its budget (./program.js) and its chat turn (null: not a chat).
 * @returns {Promise<{ budget: import('./program').Budget, chat: any }>}
 */
async function preparePrompt({ request, n, gen, grammarPending, chatOptions, parseSpecial }, ctx, systemPrompts) {
  const { prompt, tokens: given, messages } = request;
  let tokens;
  let chat = null;
  let media = null; // a prompt with images (./media.js): its images keyed in `tokens`
  const cachePoints = [];
  const images = hasImages(request) && messages !== undefined ? markImages(messages) : null;
  if (messages !== undefined) {
    // Client text that spells control tokens is marked to stay plain text (./plain-text.js).
    const rendered = parseSpecial ? messages : markMessages(ctx, messages);
    chat = await formatTurn(ctx, images ? images.messages : rendered, chatOptions);
    if (images) ({ media, tokens } = await mediaPromptOf(ctx, images.parts(chat.formatted.prompt)));
    else tokens = chat.tokens;
    if (images && rendered !== messages) throw imagesWithSpecialText();
    gen.stops.push(...chat.formatted.stopTokens.filter((s) => s !== ''));
    if (chat.grammar) {
      if (gen.grammar || grammarPending) throw invalid('give tools or a grammar / jsonSchema, not both');
      gen.grammar = chat.grammar;
      gen.lazy = chat.lazy;
    }
    const lead = images ? null : await systemPrompts.prefixOf(rendered);
    if (lead && lead.length < tokens.length && lead.every((t, i) => t === tokens[i])) cachePoints.push(lead.length);
  } else if (hasImages(request)) {
    ({ media, tokens } = await mediaPromptOf(ctx, prompt));
    const texts = Array.isArray(prompt) ? prompt.map((p) => (typeof p === 'string' ? p : p && p.text)) : [];
    if (!parseSpecial && texts.some((t) => typeof t === 'string' && spellsSpecial(ctx, t)))
      throw imagesWithSpecialText();
  } else {
    // A raw prompt is all client text: special tokens parsed only when the Scheduler says so.
    tokens = given !== undefined ? given.slice() : ctx.tokenizeSync(prompt, true, parseSpecial === true);
  }
  if (tokens.length === 0) throw invalid('the prompt tokenized to nothing; give a non-empty prompt');
  cachePoints.push(tokens.length);
  if (grammarPending) gen.grammar = await grammarPending;
  checkFits(ctx, tokens.length, n, gen.maxTokens, cachePoints.length);
  const text = promptText(chat, images, prompt, tokens.length);
  const shown = media ? { images: imagesOfPrompt(media.prompt, images ? images.images : prompt) } : {};
  const admit = {
    kind: chat ? 'chat' : 'completion',
    n,
    maxTokens: gen.maxTokens,
    promptTokens: tokens.length,
    ...shown,
  };
  const budget = {
    prompt: { tokens, cachePoints, text, ...(media ? { media } : {}) },
    cells: n * gen.maxTokens,
    leases: n,
    admit,
  };
  return { budget, chat };
}

/** Throws ERR_INVALID_ARG unless the request's cells and leases (n + a prompt branch per cache point) fit the context. */
function checkFits(ctx, nTokens, n, maxTokens, nPoints) {
  const cells = nTokens + n * maxTokens;
  if (cells > ctx.nCtx) {
    throw invalid(
      `the request needs up to ${cells} KV cells (prompt ${nTokens} + n ${n} × maxTokens ${maxTokens}) but the context has nCtx ${ctx.nCtx}; lower maxTokens or n, or create the context with a larger nCtx`,
    );
  }
  const leases = n + nPoints;
  if (leases > ctx.nSeqMax) {
    throw invalid(
      `the request needs ${leases} sequence leases (n ${n} + ${nPoints} prompt branches) but the context has nSeqMax ${ctx.nSeqMax}; lower n or create the context with a larger nSeqMax`,
    );
  }
}

/**
 * The prompt's text as events show it: the rendered chat (with images, each as `<__media__>`, not
 * the request's random marker), a prompt string, or its token count.
 */
function promptText(chat, images, prompt, nTokens) {
  if (chat) return images ? images.shown(chat.formatted.prompt) : chat.formatted.prompt;
  return typeof prompt === 'string' ? prompt : `(${nTokens} prompt tokens)`;
}

module.exports = { preparePrompt };
