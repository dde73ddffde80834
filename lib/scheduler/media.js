'use strict';

/**
 * Requests with images (docs/images.md): `scheduler.generate` of a `MediaPrompt` (from
 * `ctx.tokenizeParts`), of prompt parts (strings, image bytes, `{ imagePath }`), or of messages
 * whose content holds `{ type: 'image', image }` parts. Such a request's prompt line is prefilled
 * whole through the native path of `branch.prefill(mediaPrompt)` (each image encoded once; the n
 * choices fork after it and share its cells), not in the step's batched prefill, and it bypasses
 * the prefix cache (no lookup, no store): the cache is keyed by token ids and an image has none.
 */

const { MediaPrompt } = require('../Context');
const { markImages, messagesHaveImages } = require('../chat-images');
const { invalidArg: invalid } = require('../errors');

/** What an image position holds in a media prompt line's `tokens`: never a token id, never sampled or drafted. */
const IMAGE_POSITION = -1;

/** Whether `prompt` is a prompt with images: a MediaPrompt or an array of prompt parts. */
function isMediaInput(prompt) {
  return prompt instanceof MediaPrompt || Array.isArray(prompt);
}

/** Whether the request's prompt holds images (it then takes the path of this file). */
function hasImages(request) {
  return isMediaInput(request.prompt) || messagesHaveImages(request.messages);
}

/** Checks a media `prompt` (a MediaPrompt, or a non-empty array of parts: tokenizeParts checks each). */
function checkMediaPrompt(prompt) {
  if (Array.isArray(prompt) && prompt.length === 0)
    throw invalid('request.prompt must be a non-empty string, a MediaPrompt or a non-empty array of prompt parts');
}

/**
 * The MediaPrompt of `input` (a MediaPrompt as it is, parts tokenized on the worker) and the
 * prompt line's tokens: text tokens, and IMAGE_POSITION for each position of an image.
 * @param {any} ctx
 * @param {any} input a MediaPrompt or PromptPart[]
 */
async function mediaPromptOf(ctx, input) {
  const media = input instanceof MediaPrompt ? input : await ctx.tokenizeParts(input, true);
  const tokens = [];
  for (const piece of media.pieces) {
    if (piece.type === 'text') tokens.push(...piece.tokens);
    else for (let i = 0; i < piece.nPos; i++) tokens.push(IMAGE_POSITION);
  }
  return { media, tokens };
}

/**
 * The step's media prefill (before its batched prefill): each running media prompt line is
 * prefilled whole by `branch.prefill(mediaPrompt)` (all or nothing; a failure fails its request),
 * then its forks take their branches. Returns the positions prefilled.
 * @param {import('./programs').Programs} programs
 */
async function prefillMedia(programs) {
  programs.materialize();
  let positions = 0;
  for (const [program, line] of [...programs.runningLines()]) {
    const media = line.media;
    if (!media || !line.wantsPrefill) continue;
    try {
      await line.branch.prefill(media);
    } catch (e) {
      program.lineFailed(line, e);
      continue;
    }
    line.mediaPrefilled();
    program.prefilled(line, media.nPos);
    positions += media.nPos;
  }
  if (positions > 0) programs.materialize();
  return positions;
}

module.exports = {
  IMAGE_POSITION,
  isMediaInput,
  hasImages,
  messagesHaveImages,
  checkMediaPrompt,
  markImages,
  mediaPromptOf,
  prefillMedia,
};
