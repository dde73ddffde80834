'use strict';

// Test inputs for images: a projector with random weights for the default model (written once by
// make-mmproj.py with PyPI `gguf`, cached by the script's hash) and PNG files made here.

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const zlib = require('node:zlib');
const { spawnSync } = require('node:child_process');
const { startServer } = require('../serve-helpers');
const { testPython } = require('../../scripts/python');

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
  const res = spawnSync(testPython() || 'python3', [SCRIPT, tmp, '--n-embd', String(nEmbd)], { encoding: 'utf8' });
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

/** JPEG's zigzag order: the natural (row-major) index of each coefficient in the order it is coded. */
const ZIGZAG = (() => {
  const order = [];
  for (let d = 0; d < 15; d++) {
    const rows = [];
    for (let r = Math.max(0, d - 7); r <= Math.min(d, 7); r++) rows.push(r);
    if (d % 2 === 0) rows.reverse();
    for (const r of rows) order.push(r * 8 + (d - r));
  }
  return order;
})();

/** cos((2x + 1)uπ/16) for x, u in 0..7. */
const COS = Array.from({ length: 64 }, (_, i) => Math.cos(((2 * (i >> 3) + 1) * (i & 7) * Math.PI) / 16));

/**
 * Huffman codes of a table given as code lengths: `symbols` all `length` bits long (canonical
 * codes; none all ones as long as there are fewer than 2^length). Returns the DHT counts and the
 * code of each symbol.
 */
function huffman(symbols, length) {
  const counts = new Array(16).fill(0);
  counts[length - 1] = symbols.length;
  const codes = new Map(symbols.map((sym, i) => [sym, i]));
  return { counts, symbols, length, codes };
}

/** The DC table: categories 0..11, 4-bit codes. The AC table: EOB, ZRL and every run/size, 8-bit codes. */
const DC_TABLE = huffman([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 4);
const AC_TABLE = huffman([0x00, 0xf0, ...Array.from({ length: 160 }, (_, i) => ((i / 10) << 4) | ((i % 10) + 1))], 8);
/** One flat quantization table for every component. */
const QUANT = 4;

/**
 * A baseline JPEG (JFIF, YCbCr 4:4:4, 8×8 DCT, flat quantization by 4, Huffman tables of fixed
 * code lengths defined in the file) of `width`×`height` pixels from `pixel(x, y) → [r, g, b]`
 * (default: `png`'s seeded pattern). A tiny encoder for tests: no decoder library is needed to
 * make one, and stb_image (in llama.cpp's mtmd) reads any valid baseline file. Edge blocks repeat
 * the last row and column.
 */
function jpeg(width, height, { seed = 1, pixel } = {}) {
  const at =
    pixel || ((x, y) => [(x * 7 + y * 3 + seed * 41) & 255, (x * y + seed * 97) & 255, (x * 13 + y * 29 + seed) & 255]);
  const ycc = (x, y) => {
    const [r, g, b] = at(Math.min(x, width - 1), Math.min(y, height - 1));
    return [
      0.299 * r + 0.587 * g + 0.114 * b,
      -0.168736 * r - 0.331264 * g + 0.5 * b + 128,
      0.5 * r - 0.418688 * g - 0.081312 * b + 128,
    ];
  };
  const bytes = [];
  let acc = 0;
  let nBits = 0;
  const put = (value, length) => {
    for (let i = length - 1; i >= 0; i--) {
      acc = (acc << 1) | ((value >> i) & 1);
      if (++nBits === 8) {
        bytes.push(acc);
        if (acc === 0xff) bytes.push(0); // byte stuffing
        acc = 0;
        nBits = 0;
      }
    }
  };
  const category = (v) => (v === 0 ? 0 : 32 - Math.clz32(Math.abs(v)));
  const putValue = (v, size) => put(v >= 0 ? v : v + (1 << size) - 1, size);
  const putSymbol = (table, sym) => put(table.codes.get(sym), table.length);
  const previous = [0, 0, 0];
  for (let by = 0; by < height; by += 8) {
    for (let bx = 0; bx < width; bx += 8) {
      const block = Array.from({ length: 64 }, (_, i) => ycc(bx + (i & 7), by + (i >> 3)));
      for (let c = 0; c < 3; c++) {
        const coef = new Array(64);
        for (let v = 0; v < 8; v++) {
          for (let u = 0; u < 8; u++) {
            let sum = 0;
            for (let y = 0; y < 8; y++)
              for (let x = 0; x < 8; x++) sum += (block[y * 8 + x][c] - 128) * COS[x * 8 + u] * COS[y * 8 + v];
            const scale = (u === 0 ? Math.SQRT1_2 : 1) * (v === 0 ? Math.SQRT1_2 : 1);
            coef[v * 8 + u] = Math.round((sum * scale) / 4 / QUANT);
          }
        }
        const dc = coef[0] - previous[c];
        previous[c] = coef[0];
        putSymbol(DC_TABLE, category(dc));
        putValue(dc, category(dc));
        let run = 0;
        for (let k = 1; k < 64; k++) {
          const v = coef[ZIGZAG[k]];
          if (v === 0) {
            run++;
            continue;
          }
          for (; run > 15; run -= 16) putSymbol(AC_TABLE, 0xf0);
          putSymbol(AC_TABLE, (run << 4) | category(v));
          putValue(v, category(v));
          run = 0;
        }
        if (run > 0) putSymbol(AC_TABLE, 0x00);
      }
    }
  }
  if (nBits > 0) put(0x7f, 8 - nBits); // pad with ones
  const segment = (marker, body) => {
    const head = Buffer.alloc(4);
    head.writeUInt16BE(marker, 0);
    head.writeUInt16BE(body.length + 2, 2);
    return Buffer.concat([head, Buffer.from(body)]);
  };
  const table = (cls, t) => [cls << 4, ...t.counts, ...t.symbols];
  return Buffer.concat([
    Buffer.from([0xff, 0xd8]),
    segment(0xffe0, [...Buffer.from('JFIF\0', 'latin1'), 1, 1, 0, 0, 1, 0, 1, 0, 0]),
    segment(0xffdb, [0, ...new Array(64).fill(QUANT)]),
    segment(0xffc0, [8, height >> 8, height & 255, width >> 8, width & 255, 3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]),
    segment(0xffc4, [...table(0, DC_TABLE), ...table(1, AC_TABLE)]),
    segment(0xffda, [3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]),
    Buffer.from(bytes),
    Buffer.from([0xff, 0xd9]),
  ]);
}

/** Whether PyPI `gguf`, the test projector's writer, is installed (`npm run setup` installs it). */
const hasWriter = spawnSync(testPython() || 'python3', ['-c', 'import gguf'], { stdio: 'ignore' }).status === 0;
const MISSING_WRITER = 'the Python gguf package is not installed (python3 -m pip install gguf==0.19.0)';

/**
 * In a describe of tests that need the test projector: where its writer is missing outside CI,
 * one test that says so in its title (and checks it) stands for them, and this returns true (the
 * describe returns); in CI a missing writer fails their before hook instead (`needWriter`).
 */
function projectorMissing() {
  if (hasWriter || process.env.CI === 'true') return false;
  it(`not run here: ${MISSING_WRITER}`, function () {
    if (spawnSync(testPython() || 'python3', ['-c', 'import gguf'], { stdio: 'ignore' }).status === 0)
      throw new Error('gguf is installed after all');
  });
  return true;
}

/** Throws (in a before hook) when the projector's writer is missing. */
function needWriter() {
  if (!hasWriter) throw new Error(`${MISSING_WRITER}: CI installs it with node scripts/setup.js`);
}

/**
 * `llama-branch serve --mmproj` with the test projector, as a process on 127.0.0.1 (2 slots,
 * 2,048 cells, 2 threads, model name `x`): resolves what serve-helpers' `startServer` does.
 */
function startProjectorServer() {
  const args = ['--parallel', '2', '--ctx-size', '2048', '--threads', '2', '--model-name', 'x'];
  return startServer(['--mmproj', projectorPath(), ...args]);
}

/** The counter `name` in a server's /metrics text at `url`. */
async function metric(url, name) {
  const body = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\d+)`, 'm').exec(body);
  if (!m) throw new Error(`${name} is not in /metrics`);
  return Number(m[1]);
}

module.exports = {
  projectorMissing,
  startProjectorServer,
  needWriter,
  metric,
  projectorPath,
  png,
  bmp,
  jpeg,
};
