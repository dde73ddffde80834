'use strict';

/**
 * Requests with images (docs/images.md): `scheduler.generate` of a `MediaPrompt` (from
 * `ctx.tokenizeParts`), of prompt parts (strings, image bytes, `{ imagePath }`), or of messages
 * whose content holds `{ type: 'image', image }` parts. Such a request's prompt line holds a key
 * for each image position (./image-keys.js: derived from the image's bytes), so the prefix cache
 * finds the same images again in any tier. Its positions are prefilled by the native path of
 * `branch.prefill(mediaPrompt, { from, to })`, every such line of a step in one worker job
 * (`BranchStore.prefillMedia`; each image encoded once, the n choices fork after it and share
 * its cells), before the step's batched text prefill: from where its cached start ends to its
 * next cache point at a time, so its prefixes become cache entries like any prompt's.
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
 * The step's media prefill (before its batched prefill), as plan, run, apply: each running media
 * prompt line plans its prompt from what its branch holds (a cached start) to its next cache
 * point; ONE worker job prefills every planned line (`BranchStore.prefillMedia`: each entry all
 * or nothing, a failure fails its line's job alone); then each line that got its positions takes
 * them, a filled cache point becoming a cache entry. Returns the positions prefilled.
 * @param {import('./programs').Programs} programs
 * @param {any} store the context's BranchStore
 */
async function prefillMedia(programs, store) {
  const planned = planMedia(programs);
  if (planned.length === 0) return 0;
  let failures;
  try {
    failures = await store.prefillMedia(planned.map(({ entry }) => entry));
  } catch (e) {
    failures = planned.map(() => e); // the job itself failed (e.g. the context was disposed)
  }
  let positions = 0;
  planned.forEach(({ program, line, take }, i) => {
    if (failures[i]) return program.lineFailed(line, failures[i]);
    try {
      program.countPrefill(line, take);
      programs.recordPrefill(line, take, false, true);
      line.prefilled(take, null, () => programs.fits(0, 1));
    } catch (e) {
      return program.lineFailed(line, e);
    }
    positions += take;
  });
  return positions;
}

/**
 * The media entries of the step: lines whose next positions are an image prompt's, each with
 * its `[branch, prompt, { from, to }]` entry and the positions it takes.
 * @param {import('./programs').Programs} programs
 */
function planMedia(programs) {
  const planned = [];
  for (const [program, line] of programs.runningLines()) {
    const media = line.lineStart.nextMedia(line.computed);
    if (!media || !line.wantsPrefill || line.computed < media.at) continue; // its text first
    const { prompt, at } = media;
    const end = Math.min(line.lineStart.segmentEnd ?? Infinity, at + prompt.nPos);
    const take = end - line.computed;
    if (!program.checkCells(line, take)) continue;
    const entry = [line.branch, prompt, { from: line.computed - at, to: end - at }];
    planned.push({ program, line, take, entry });
  }
  return planned;
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
