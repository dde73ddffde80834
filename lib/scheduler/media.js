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
const { MEDIA_MARKER, markImages, messagesHaveImages } = require('../chat-images');
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
  const { tokens, images } = linePiecesOf(prompt, 0);
  return { media: { prompt, images }, tokens };
}

/**
 * A MediaPrompt as a line holds it from position `at`: its tokens (text tokens, each image's
 * keys) and its images' places in the line.
 * @param {any} prompt a MediaPrompt
 * @param {number} at
 */
function linePiecesOf(prompt, at) {
  const tokens = [];
  const images = [];
  for (const piece of prompt.pieces) {
    if (piece.type === 'text') tokens.push(...piece.tokens);
    else {
      images.push({ start: at + tokens.length, nPos: piece.nPos, id: piece.id });
      tokens.push(...imageKeys(piece.id, piece.nPos));
    }
  }
  return { tokens, images };
}

/**
 * What a line's text shows of a MediaPrompt: its text pieces detokenized, each image as the
 * marker mtmd's own prompts use (only a program's line keeps a text; a request's prompt has one).
 * @param {any} ctx
 * @param {any} prompt a MediaPrompt
 */
function mediaText(ctx, prompt) {
  return prompt.pieces
    .map((p) => (p.type === 'text' ? p.tokens.map((t) => ctx.tokenToText(t)).join('') : MEDIA_MARKER))
    .join('');
}

/**
 * Text beside images is tokenized by mtmd with special tokens parsed: until it can be kept plain
 * (./plain-text.js), text that spells them is refused rather than read as control tokens. One
 * refusal for requests and decisions, naming both ways to turn parsing on.
 * @param {string} [param]
 */
function imagesWithSpecialText(param) {
  return invalid(
    "text beside images that spells the model's special tokens cannot be kept as plain text yet: remove that text, or create the Scheduler with parseSpecial: true (serve --parse-special)",
    param,
  );
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
    const media = line.lineStart.nextMedia(line.computed);
    if (!media || !line.wantsPrefill || line.computed < media.at) continue; // its text first
    const { prompt, at } = media;
    const end = Math.min(line.lineStart.segmentEnd ?? Infinity, at + prompt.nPos);
    const take = end - line.computed;
    if (!program.checkCells(line, take)) continue;
    try {
      await line.branch.prefill(prompt, { from: line.computed - at, to: end - at });
      program.countPrefill(line, take);
      programs.recordPrefill(line, take, false, true);
      line.prefilled(take, null, () => programs.fits(0, 1));
    } catch (e) {
      program.lineFailed(line, e);
      continue;
    }
    positions += take;
  }
  if (positions > 0) programs.materialize();
  return positions;
}

module.exports = {
  linePiecesOf,
  mediaText,
  imagesWithSpecialText,
  isMediaInput,
  hasImages,
  messagesHaveImages,
  checkMediaPrompt,
  markImages,
  mediaPromptOf,
  prefillMedia,
};
