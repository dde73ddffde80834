'use strict';

/**
 * How an image stands in a line's tokens, so that the prefix cache (./prefix-cache.js), which
 * keys prefixes by token lists, keys an image by its bytes: each of its positions holds a key
 * derived from the image's id (the SHA-256 of its file bytes) and the position's place in it —
 * never a token id (keys are negative), never sampled, drafted or detokenized. The same image
 * gives the same keys (a hit), one changed pixel other keys (a miss). An image's first key is
 * even and the rest odd, so a cut inside an image is seen from the tokens alone (`edge`): a
 * prefix may end before or after an image, never inside it (its positions attend to each other).
 * Files hold -1 at an image's positions and the images beside (`toFile`, `fromFile`).
 */

/** What a saved token list holds at an image's positions. */
const FILE_IMAGE_POSITION = -1;

/**
 * @typedef {{ start: number, nPos: number, id: string }} ImageSpan an image's positions
 *   `[start, start + nPos)` in a prefix, and its id (SHA-256 hex of its file bytes)
 */

/**
 * 29 bits of `id` for position `k` of its image: its 32-bit words in turn, mixed with `k` (keys
 * stay within a signed 32-bit integer, as token lists are written: files, KV event blocks).
 */
function bitsAt(id, k) {
  const word = parseInt(id.slice((k % 8) * 8, (k % 8) * 8 + 8), 16) >>> 0;
  return ((word ^ Math.imul(k + 1, 0x9e3779b1)) >>> 0) >>> 3;
}

/** The keys of an image's `nPos` positions. */
function imageKeys(id, nPos) {
  return Array.from({ length: nPos }, (_, k) => -(k === 0 ? 2 : 3) - 2 * bitsAt(id, k));
}

/** Whether `token` is an image's key past its first position (a cut before it is inside the image). */
const continuesImage = (token) => token < 0 && -token % 2 === 1;

/**
 * The longest cut of `tokens` at most `at` long that does not end inside an image (an image cut
 * in two is moved before it).
 * @param {ArrayLike<number>} tokens
 * @param {number} at
 */
function edge(tokens, at) {
  while (at > 0 && at < tokens.length && continuesImage(tokens[at])) at--;
  return at;
}

/** The spans wholly inside the first `end` positions. @param {ImageSpan[]} images */
const imagesBelow = (images, end) => images.filter((s) => s.start + s.nPos <= end);

/** `tokens` as a file holds them: FILE_IMAGE_POSITION at every image key. */
const toFile = (tokens) => tokens.map((t) => (t < 0 ? FILE_IMAGE_POSITION : t));

/**
 * A file's tokens keyed again from its images (`images` checked against the tokens by the native
 * reader: -1 exactly at their positions).
 * @param {number[]} tokens
 * @param {ImageSpan[]} [images]
 */
function fromFile(tokens, images = []) {
  const keyed = tokens.slice();
  for (const { start, nPos, id } of images) keyed.splice(start, nPos, ...imageKeys(id, nPos));
  return keyed;
}

module.exports = { FILE_IMAGE_POSITION, imageKeys, continuesImage, edge, imagesBelow, toFile, fromFile };
