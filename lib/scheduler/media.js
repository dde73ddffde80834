'use strict';

/**
 * Requests with images (docs/images.md): `scheduler.generate` of a `MediaPrompt` (from
 * `ctx.tokenizeParts`), of prompt parts (strings, image bytes, `{ imagePath }`), or of messages
 * whose content holds `{ type: 'image', image }` parts. Such a request's prompt line holds a key
 * for each image position (./image-keys.js: derived from the image's bytes), so the prefix cache
 * finds the same images again in any tier. Its positions are prefilled through the native path of
 * `branch.prefill(mediaPrompt, { from, to })` (each image encoded once; the n choices fork after
 * it and share its cells), not in the step's batched prefill: from where its cached start ends to
 * its next cache point at a time, so its prefixes become cache entries like any prompt's.
 */

const { MediaPrompt } = require('../Context');
const { markImages, messagesHaveImages } = require('../chat-images');
const { invalidArg: invalid } = require('../errors');
const { imageKeys } = require('./image-keys');

/**
 * A prompt line's images: the MediaPrompt its positions are prefilled from, and where its images
 * sit (their keys are in the line's tokens).
 * @typedef {{ prompt: any, images: import('./image-keys').ImageSpan[] }} PromptMedia
 */

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
 * The prompt line's media of `input` (a MediaPrompt as it is, parts tokenized on the worker) and
 * its tokens: text tokens, and each image's keys (./image-keys.js).
 * @param {any} ctx
 * @param {any} input a MediaPrompt or PromptPart[]
 * @returns {Promise<{ media: PromptMedia, tokens: number[] }>}
 */
async function mediaPromptOf(ctx, input) {
  const prompt = input instanceof MediaPrompt ? input : await ctx.tokenizeParts(input, true);
  const { tokens, images } = linePiecesOf(ctx, prompt, 0);
  return { media: { prompt, images }, tokens };
}

/** What a line's text shows of an image: the marker mtmd's own prompts use. */
const IMAGE_TEXT = '<__media__>';

/**
 * A MediaPrompt as a line appends it at position `at`: its tokens (text tokens, each image's
 * keys), its images' places in the line, and its text (the text pieces detokenized, IMAGE_TEXT
 * for each image).
 * @param {any} ctx
 * @param {any} prompt a MediaPrompt
 * @param {number} at
 */
function linePiecesOf(ctx, prompt, at) {
  const tokens = [];
  const images = [];
  let text = '';
  for (const piece of prompt.pieces) {
    if (piece.type === 'text') {
      tokens.push(...piece.tokens);
      text += piece.tokens.map((t) => ctx.tokenToText(t)).join('');
    } else {
      images.push({ start: at + tokens.length, nPos: piece.nPos, id: piece.id });
      tokens.push(...imageKeys(piece.id, piece.nPos));
      text += IMAGE_TEXT;
    }
  }
  return { tokens, images, text };
}

/**
 * The step's media prefill (before its batched prefill): each running media prompt line prefills
 * its prompt from what its branch holds (a cached start) to its next cache point by
 * `branch.prefill(mediaPrompt, { from, to })` (all or nothing; a failure fails its request); a
 * filled cache point becomes a cache entry, and once the prompt is in, its forks take their
 * branches. Returns the positions prefilled.
 * @param {import('./programs').Programs} programs
 */
async function prefillMedia(programs) {
  programs.materialize();
  let positions = 0;
  for (const [program, line] of [...programs.runningLines()]) {
    const media = line.nextMedia;
    if (!media || !line.wantsPrefill || line.filled < media.at) continue; // its text first
    const { prompt, at } = media;
    const end = Math.min(line.segmentEnd ?? Infinity, at + prompt.nPos);
    const take = end - line.filled;
    if (program.cellsUsed + take > program.maxCells) {
      program.lineFailed(line, program.cellsExceeded(take));
      continue;
    }
    try {
      await line.branch.prefill(prompt, { from: line.filled - at, to: end - at });
      program.prefilled(line, take);
      line.prefilled(take, null, line.fillsUnreservedEntry(take) && programs.fits(0, 1));
    } catch (e) {
      program.lineFailed(line, e);
      continue;
    }
    if (line.filled >= at + prompt.nPos) line.mediaPrefilled();
    positions += take;
  }
  if (positions > 0) programs.materialize();
  return positions;
}

module.exports = {
  linePiecesOf,
  isMediaInput,
  hasImages,
  messagesHaveImages,
  checkMediaPrompt,
  markImages,
  mediaPromptOf,
  prefillMedia,
};
