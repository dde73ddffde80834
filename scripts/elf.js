'use strict';

/**
 * Reads the dynamic section of an ELF shared library: which libraries it needs (DT_NEEDED) and where it
 * looks for them (DT_RPATH / DT_RUNPATH), without binutils: scripts/build-prebuilt.js ships exactly the
 * libraries the addon needs. 64-bit little-endian ELF only (x86-64, aarch64); other files throw.
 */

const fs = require('node:fs');

const SHT_DYNAMIC = 6;
const DT_NULL = 0;
const DT_NEEDED = 1;
const DT_RPATH = 15;
const DT_RUNPATH = 29;

function cString(buf, offset) {
  const end = buf.indexOf(0, offset);
  return buf.toString('utf8', offset, end === -1 ? buf.length : end);
}

/** { needed: string[], rpath, runpath } of the ELF file at `file` (null = absent). */
function readDynamic(file) {
  const buf = fs.readFileSync(file);
  if (buf.length < 64 || buf.readUInt32BE(0) !== 0x7f454c46) throw new Error(`${file} is not an ELF file`);
  if (buf[4] !== 2 || buf[5] !== 1) throw new Error(`${file}: only 64-bit little-endian ELF is supported`);
  const shoff = Number(buf.readBigUInt64LE(0x28));
  const shentsize = buf.readUInt16LE(0x3a);
  const shnum = buf.readUInt16LE(0x3c);
  const section = (i) => {
    const at = shoff + i * shentsize;
    return {
      type: buf.readUInt32LE(at + 4),
      offset: Number(buf.readBigUInt64LE(at + 0x18)),
      size: Number(buf.readBigUInt64LE(at + 0x20)),
      link: buf.readUInt32LE(at + 0x28),
    };
  };
  const out = { needed: [], rpath: null, runpath: null };
  for (let i = 0; i < shnum; i++) {
    const dyn = section(i);
    if (dyn.type !== SHT_DYNAMIC) continue;
    const strtab = section(dyn.link);
    const str = (offset) => cString(buf, strtab.offset + offset);
    for (let at = dyn.offset; at + 16 <= dyn.offset + dyn.size; at += 16) {
      const tag = Number(buf.readBigInt64LE(at));
      const val = Number(buf.readBigUInt64LE(at + 8));
      if (tag === DT_NULL) break;
      if (tag === DT_NEEDED) out.needed.push(str(val));
      else if (tag === DT_RPATH) out.rpath = str(val);
      else if (tag === DT_RUNPATH) out.runpath = str(val);
    }
  }
  return out;
}

module.exports = { readDynamic };
