'use strict';

/**
 * Chat messages whose content holds image parts (docs/images.md), rendered by the chat template
 * through one path for `ctx.formatChat` and the Scheduler's requests: each image part becomes a
 * marker no text holds (random per call), the messages are rendered, and the template's output is
 * cut at the markers into prompt parts (strings and images, in order) for `ctx.tokenizeParts`.
 */

const { randomBytes } = require('node:crypto');
const { invalidArg } = require('./errors');

/**
 * What `formatChat`'s `prompt` shows where an image goes: the marker llama.cpp's mtmd and its
 * server write there. Only a display: a text may spell it too, so `parts` is the prompt to use.
 */
const MEDIA_MARKER = '<__media__>';

/** The data URLs of images llama-branch decodes: base64 (PNG, JPEG, GIF or BMP bytes: the projector's decoder reads them). */
const DATA_URL = /^data:(image\/[a-z0-9.+-]+)?(;[^,;]*)*;base64,/i;

/**
 * The bytes of an image sent as a URL (a chat's `image_url`, a decision's `input_image`, System
 * One's `images`): a base64 data URL only; an http(s) URL is never fetched. ERR_INVALID_ARG
 * naming the part (`where`) or its URL's field in it (`where` + `field`), with `param`.
 * @param {string} url
 * @param {string} where
 * @param {string} field
 * @param {string} param
 * @returns {Buffer}
 */
function dataUrlBytes(url, where, field, param) {
  if (/^https?:/i.test(url))
    throw invalidArg(
      `${where}: image URLs are never fetched; send the image inline as a data URL (data:image/png;base64,...); data URLs only`,
      param,
    );
  const head = DATA_URL.exec(url);
  if (!head) throw invalidArg(`${where}${field} must be a base64 data URL (data:image/png;base64,...)`, param);
  const bytes = Buffer.from(url.slice(head[0].length), 'base64');
  if (bytes.length === 0)
    throw invalidArg(
      `${where}${field} holds no image bytes: send a base64 data URL (data:image/png;base64,...)`,
      param,
    );
  return bytes;
}

/** Whether `p` is a message content part of type `'image'`. */
const isImagePart = (p) => p !== null && typeof p === 'object' && p.type === 'image';

/** Whether `messages` (an array of chat messages) hold an image part. */
function messagesHaveImages(messages) {
  return (
    Array.isArray(messages) &&
    messages.some((m) => m && Array.isArray(m.content) && m.content.some((p) => isImagePart(p)))
  );
}

/**
 * The prompt part of an image content part: its bytes (`image`) or `{ imagePath }`.
 * @param {any} p
 * @param {string} where the part's param path
 * @param {string} lead what the error's message starts with
 * @returns {Uint8Array | { imagePath: string }}
 */
function imageOf(p, where, lead) {
  const hasBytes = p.image !== undefined;
  const hasPath = p.imagePath !== undefined;
  if (hasBytes === hasPath)
    throw invalidArg(
      `${lead}${where} must have either image (a Uint8Array or Buffer of image file bytes) or imagePath (a file path), not ${hasBytes ? 'both' : 'neither'}`,
      where,
    );
  if (hasBytes) {
    if (!(p.image instanceof Uint8Array))
      throw invalidArg(`${lead}${where}.image must be a Uint8Array or Buffer of image file bytes`, `${where}.image`);
    return p.image;
  }
  if (typeof p.imagePath !== 'string' || p.imagePath === '')
    throw invalidArg(`${lead}${where}.imagePath must be a non-empty string (a file path)`, `${where}.imagePath`);
  return { imagePath: p.imagePath };
}

/**
 * Messages whose image parts are replaced by a marker no text holds (random per call), each such
 * message's content joined into one string, and what splits the chat template's output back into
 * parts. Throws ERR_INVALID_ARG naming the part (`param` `${param}[i].content[k]`, also in the
 * message) for a part that is neither `{ type: 'text', text }` nor `{ type: 'image', image |
 * imagePath }`.
 * @param {any[]} messages
 * @param {string} [param] how the messages are named in errors
 * @param {string} [lead] what the errors' messages start with (e.g. the method's name)
 */
function markImages(messages, param = 'request.messages', lead = '') {
  const marker = `<__llama_branch_image_${randomBytes(8).toString('hex')}__>`;
  /** @type {(Uint8Array | { imagePath: string })[]} */
  const images = [];
  const marked = messages.map((m, i) => {
    if (!m || !Array.isArray(m.content)) return m;
    const text = m.content
      .map((p, k) => {
        const where = `${param}[${i}].content[${k}]`;
        if (isImagePart(p)) {
          images.push(imageOf(p, where, lead));
          return marker;
        }
        if (p && p.type === 'text' && typeof p.text === 'string') return p.text;
        throw invalidArg(
          `${lead}${where} must be { type: 'text', text: string }, { type: 'image', image: Uint8Array } or { type: 'image', imagePath: string }`,
          where,
        );
      })
      .join('');
    return { ...m, content: text };
  });
  /** The rendered prompt cut at the markers, each image in its place. */
  const texts = (/** @type {string} */ formatted) => {
    const cut = formatted.split(marker);
    if (cut.length !== images.length + 1)
      throw invalidArg(
        `${lead}the chat template rendered ${cut.length - 1} of the messages' ${images.length} images; put images in user messages`,
        param,
      );
    return cut;
  };
  return {
    messages: marked,
    /** The image parts in order (bytes, or `{ imagePath }`). */
    images,
    /**
     * The rendered prompt as prompt parts: strings and images in order (`ctx.tokenizeParts`).
     * @param {string} formatted
     * @returns {(string | Uint8Array | { imagePath: string })[]}
     */
    parts: (formatted) => texts(formatted).flatMap((t, k) => (k < images.length ? [t, images[k]] : [t])),
    /**
     * The rendered prompt as text, MEDIA_MARKER where each image goes.
     * @param {string} formatted
     */
    shown: (formatted) => texts(formatted).join(MEDIA_MARKER),
  };
}

module.exports = { MEDIA_MARKER, dataUrlBytes, isImagePart, messagesHaveImages, markImages };
