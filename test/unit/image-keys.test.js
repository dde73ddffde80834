'use strict';

// lib/scheduler/image-keys.js: how an image stands in a prompt's token list for the prefix cache.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { imageKeys, continuesImage, edge, imagesBelow, toFile, fromFile } = require('../../lib/scheduler/image-keys');

const sha = (s) => crypto.createHash('sha256').update(s).digest('hex');

describe('image keys (no model)', () => {
  it('the same id gives the same keys; another id other keys at every position; all negative int32', () => {
    const [a, b] = [sha('a'), sha('b')];
    const ka = imageKeys(a, 256);
    assert.deepEqual(imageKeys(a, 256), ka);
    const kb = imageKeys(b, 256);
    assert.ok(ka.every((k, i) => k !== kb[i]));
    for (const k of [...ka, ...kb]) assert.ok(Number.isInteger(k) && k < 0 && k >= -(2 ** 31), `${k}`);
    assert.ok(new Set(ka).size > 200, 'positions of one image differ');
    // The first key is even, the rest odd: a cut is seen from the tokens alone.
    assert.equal(continuesImage(ka[0]), false);
    assert.ok(ka.slice(1).every(continuesImage));
    assert.equal(continuesImage(5), false);
  });

  it('edge moves a cut inside an image back to its start; cuts in text and at image ends stay', () => {
    const img = imageKeys(sha('x'), 4);
    const next = imageKeys(sha('y'), 3);
    const tokens = [1, 2, ...img, ...next, 7, 8];
    assert.equal(edge(tokens, 1), 1);
    assert.equal(edge(tokens, 2), 2, 'before the first image');
    for (const at of [3, 4, 5]) assert.equal(edge(tokens, at), 2);
    assert.equal(edge(tokens, 6), 6, 'between two images');
    assert.equal(edge(tokens, 8), 6);
    assert.equal(edge(tokens, 9), 9);
    assert.equal(edge(tokens, tokens.length), tokens.length);
  });

  it('a file holds -1 at image positions and the spans beside; reading keys them again', () => {
    const id = sha('z');
    const tokens = [5, ...imageKeys(id, 3), 6];
    const images = [{ start: 1, nPos: 3, id }];
    assert.deepEqual(toFile(tokens), [5, -1, -1, -1, 6]);
    assert.deepEqual(fromFile(toFile(tokens), images), tokens);
    assert.deepEqual(fromFile([1, 2]), [1, 2]);
    assert.deepEqual(imagesBelow(images, 3), []);
    assert.deepEqual(imagesBelow(images, 4), images);
  });
});
