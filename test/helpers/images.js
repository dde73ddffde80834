'use strict';

// Test inputs for images: a projector with random weights for the default model (written once by
// make-mmproj.py with PyPI `gguf`, cached by the script's hash) and PNG files made here.

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const zlib = require('node:zlib');
const { spawnSync } = require('node:child_process');

const SCRIPT = path.join(__dirname, 'make-mmproj.py');

/**
 * The path of a random-weight gemma3 projector whose output width is `nEmbd` (640: the default
 * model's; anything else: a mismatched one), written on first use. Throws saying how to install
 * the writer when Python's `gguf` is missing.
 */
function projectorPath(nEmbd = 640) {
  const hash = crypto.createHash('sha256').update(fs.readFileSync(SCRIPT)).digest('hex').slice(0, 12);
  const dir = path.join(os.tmpdir(), 'llama-branch-test-mmproj');
  const file = path.join(dir, `gemma3-random-${nEmbd}-${hash}.gguf`);
  if (fs.existsSync(file)) return file;
  fs.mkdirSync(dir, { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  const res = spawnSync('python3', [SCRIPT, tmp, '--n-embd', String(nEmbd)], { encoding: 'utf8' });
  if (res.status !== 0) {
    throw new Error(
      `writing the test projector failed (${(res.stderr || res.error?.message || '').trim().split('\n').pop()}); ` +
        'install its writer with `python3 -m pip install gguf==0.19.0` (npm run setup does)',
    );
  }
  fs.renameSync(tmp, file);
  return file;
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(type, 'ascii'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([len, body, crc]);
}

/**
 * An RGB PNG of `width`×`height` whose pixels come from `pixel(x, y) → [r, g, b]` (default: a
 * pattern seeded by `seed`).
 */
function png(width, height, { seed = 1, pixel } = {}) {
  const at =
    pixel || ((x, y) => [(x * 7 + y * 3 + seed * 41) & 255, (x * y + seed * 97) & 255, (x * 13 + y * 29 + seed) & 255]);
  const raw = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) {
    const row = y * (width * 3 + 1);
    raw[row] = 0; // filter: none
    for (let x = 0; x < width; x++) raw.set(at(x, y), row + 1 + x * 3);
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, 0], 8); // 8-bit RGB
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

/** The same image as `png(width, height, options)`, as a 24-bit BMP (bottom-up rows, BGR). */
function bmp(width, height, { seed = 1, pixel } = {}) {
  const at =
    pixel || ((x, y) => [(x * 7 + y * 3 + seed * 41) & 255, (x * y + seed * 97) & 255, (x * 13 + y * 29 + seed) & 255]);
  const stride = (width * 3 + 3) & ~3;
  const out = Buffer.alloc(54 + stride * height);
  out.write('BM', 0, 'ascii');
  out.writeUInt32LE(out.length, 2);
  out.writeUInt32LE(54, 10);
  out.writeUInt32LE(40, 14);
  out.writeInt32LE(width, 18);
  out.writeInt32LE(height, 22);
  out.writeUInt16LE(1, 26);
  out.writeUInt16LE(24, 28);
  out.writeUInt32LE(stride * height, 34);
  for (let y = 0; y < height; y++) {
    const row = 54 + (height - 1 - y) * stride;
    for (let x = 0; x < width; x++) {
      const [r, g, b] = at(x, y);
      out.set([b, g, r], row + x * 3);
    }
  }
  return out;
}

module.exports = { projectorPath, png, bmp };
