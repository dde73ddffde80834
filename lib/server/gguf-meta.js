'use strict';

/**
 * Reads a GGUF file's metadata (its header's key/value section, not the tensors): what the gRPC
 * worker needs to hand a router the model's tokenizer (./hf-tokenizer.js). GGUF v2/v3: magic
 * "GGUF", version, tensor count, key/value count, then each key (a u64-length string), its type
 * and value; arrays carry an element type and a u64 count. Only keys that `wanted(key)` accepts
 * are decoded; the others are skipped over. Little-endian files only (the only ones llama.cpp
 * writes by default).
 */

const fs = require('node:fs');

const TYPES = ['u8', 'i8', 'u16', 'i16', 'u32', 'i32', 'f32', 'bool', 'string', 'array', 'u64', 'i64', 'f64'];
const FIXED = { u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, bool: 1, u64: 8, i64: 8, f64: 8 };

/** Reads a file forward through a growing buffer (the metadata of a 262k-token vocabulary is ~6 MB). */
class ForwardReader {
  constructor(file) {
    this.fd = fs.openSync(file, 'r');
    this.buf = Buffer.alloc(0);
    this.pos = 0; // within buf
    this.fileOffset = 0; // of buf[0]
  }

  need(n) {
    if (this.pos + n <= this.buf.length) return;
    const rest = this.buf.subarray(this.pos);
    const chunk = Buffer.alloc(Math.max(n, 1 << 20));
    const got = fs.readSync(this.fd, chunk, 0, chunk.length, this.fileOffset + this.buf.length);
    if (rest.length + got < n) throw new Error('the GGUF file ends inside its metadata');
    this.fileOffset += this.pos;
    this.buf = Buffer.concat([rest, chunk.subarray(0, got)]);
    this.pos = 0;
  }

  /** @returns {any} */
  scalar(type) {
    const size = FIXED[type];
    this.need(size);
    const b = this.buf;
    const at = this.pos;
    this.pos += size;
    switch (type) {
      case 'u8':
        return b.readUInt8(at);
      case 'i8':
        return b.readInt8(at);
      case 'u16':
        return b.readUInt16LE(at);
      case 'i16':
        return b.readInt16LE(at);
      case 'u32':
        return b.readUInt32LE(at);
      case 'i32':
        return b.readInt32LE(at);
      case 'f32':
        return b.readFloatLE(at);
      case 'bool':
        return b.readUInt8(at) !== 0;
      case 'u64':
        return Number(b.readBigUInt64LE(at));
      case 'i64':
        return Number(b.readBigInt64LE(at));
      default:
        return b.readDoubleLE(at);
    }
  }

  string() {
    const length = this.scalar('u64');
    this.need(length);
    const s = this.buf.toString('utf8', this.pos, this.pos + length);
    this.pos += length;
    return s;
  }

  /** A value of `type`; `keep` false: skipped over (arrays of fixed-size items in one jump). */
  value(type, keep) {
    if (type === 'string') return this.string();
    if (type !== 'array') return this.scalar(type);
    const itemType = this.type();
    const count = this.scalar('u64');
    if (!keep && FIXED[itemType]) {
      this.skip(count * FIXED[itemType]);
      return null;
    }
    const items = new Array(count);
    for (let i = 0; i < count; i++) items[i] = this.value(itemType, keep);
    return keep ? items : null;
  }

  skip(n) {
    while (n > 0) {
      const step = Math.min(n, 1 << 20);
      this.need(step);
      this.pos += step;
      n -= step;
    }
  }

  type() {
    const code = this.scalar('u32');
    if (code >= TYPES.length) throw new Error(`the GGUF metadata has an unknown value type ${code}`);
    return TYPES[code];
  }

  close() {
    fs.closeSync(this.fd);
  }
}

/**
 * The metadata of the GGUF file `file` whose keys `wanted` accepts, as a Map (arrays as JS
 * arrays, 64-bit integers as numbers). Throws with what is wrong for a file that is not GGUF.
 * @param {string} file @param {(key: string) => boolean} [wanted]
 */
function readGgufMeta(file, wanted = () => true) {
  const r = new ForwardReader(file);
  try {
    r.need(24);
    if (r.buf.toString('latin1', 0, 4) !== 'GGUF') throw new Error(`${file} is not a GGUF file`);
    r.pos = 4;
    const version = r.scalar('u32');
    if (version < 2 || version > 3) throw new Error(`${file}: GGUF version ${version} is not supported (2 or 3)`);
    r.scalar('u64'); // tensors
    const count = r.scalar('u64');
    const meta = new Map();
    for (let i = 0; i < count; i++) {
      const key = r.string();
      const keep = wanted(key);
      const value = r.value(r.type(), keep);
      if (keep) meta.set(key, value);
    }
    return meta;
  } finally {
    r.close();
  }
}

module.exports = { readGgufMeta };
