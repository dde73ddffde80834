'use strict';

// The binary loader (lib/loader.js), loadBinary(variant), createContext's loadOptions and the
// install script's prebuilt check. Resolution order is tested in child processes on a scratch
// copy of the package, with copies of the source build standing in for the platform packages.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const llama = require('..');
const { platformKey, platformPackageName } = require('../lib/loader');
const { MODEL, rejects, throwsSync } = require('./helpers');

const ROOT = path.join(__dirname, '..');
const SOURCE_BUILD = path.join(ROOT, 'build', 'llama_branch.node');
const builtFeatures = (info = 'llama_branch.json') => {
  try {
    return JSON.parse(fs.readFileSync(path.join(ROOT, 'build', info), 'utf8')).features;
  } catch {
    return [];
  }
};

describe('loader: loadBinary(variant)', function () {
  it('returns the default binding for undefined, "default" and "cpu"', function () {
    const binding = llama.loadBinary();
    assert.equal(llama.loadBinary('default'), binding);
    assert.equal(llama.loadBinary('cpu'), binding);
    assert.equal(typeof binding.systemInfo, 'function');
    assert.equal(binding.systemInfo(), llama.systemInfo());
    assert.equal(binding.SessionContext, llama.SessionContext);
  });

  it('the loaded addon has at least one compute device', function () {
    assert.ok(require('../lib/native')._setBackendDir(path.dirname(SOURCE_BUILD)) >= 1);
  });

  for (const variant of ['cuda', 'vulkan']) {
    it(`"${variant}": the build with that feature, else ERR_NATIVE_LOAD saying how to get one`, async function () {
      if (builtFeatures(path.join(variant, 'llama_branch.json')).includes(variant)) {
        // A build kept beside the CPU one (npm run test:gpu makes build/vulkan/): a second binding.
        const binding = llama.loadBinary(variant);
        assert.notEqual(binding, llama.loadBinary());
        assert.equal(typeof binding.SessionContext, 'function');
        return;
      }
      if (builtFeatures().includes(variant) && !process.env.LLAMA_BRANCH_BINARY) {
        assert.equal(llama.loadBinary(variant), llama.loadBinary());
        return;
      }
      const err = throwsSync(() => llama.loadBinary(variant), 'ERR_NATIVE_LOAD');
      // cuda: its own platform package; vulkan: a module package the CPU prebuilt loads.
      assert.match(
        err.message,
        variant === 'vulkan'
          ? new RegExp(
              `the prebuilt ${platformPackageName(null)} with ${platformPackageName(variant)}: ${platformPackageName(null)} not installed`,
            )
          : new RegExp(`platform package ${platformPackageName(variant)}: not installed`),
      );
      if (variant === 'vulkan') assert.match(err.message, new RegExp(`npm install ${platformPackageName('vulkan')}`));
      assert.match(
        err.message,
        new RegExp(`LLAMA_BRANCH_FEATURES=${variant} LLAMA_BRANCH_BUILD_FROM_SOURCE=1 npm rebuild llama-branch`),
      );
      await rejects(
        () => llama.createContext({ modelPath: MODEL }, { gpuVariant: variant }),
        'ERR_NATIVE_LOAD',
        /npm rebuild llama-branch/,
      );
    });
  }

  it('rejects unknown variants with ERR_INVALID_ARG', function () {
    for (const bad of ['rocm', '', 'CUDA', 5, {}, true]) {
      const err = throwsSync(() => llama.loadBinary(bad), 'ERR_INVALID_ARG');
      assert.match(err.message, /'default', 'cpu', 'cuda' or 'vulkan'/);
    }
  });
});

describe('loader: createContext(options, loadOptions)', function () {
  it('creates the context with the default binding for no, null, {} and gpuVariant "default"/"cpu"', async function () {
    for (const loadOptions of [
      undefined,
      null,
      {},
      { gpuVariant: 'default' },
      { gpuVariant: 'cpu' },
      { gpuVariant: undefined },
    ]) {
      const ctx = await llama.createContext({ modelPath: MODEL, nCtx: 64, nSeqMax: 1 }, loadOptions);
      assert.ok(ctx instanceof llama.SessionContext);
      assert.ok(ctx.vocabSize > 0);
      ctx.dispose();
    }
  });

  it('rejects malformed loadOptions with ERR_INVALID_ARG', async function () {
    const opts = { modelPath: MODEL };
    await rejects(() => llama.createContext(opts, 'vulkan'), 'ERR_INVALID_ARG', /loadOptions must be an object/);
    await rejects(() => llama.createContext(opts, ['vulkan']), 'ERR_INVALID_ARG', /an array/);
    await rejects(
      () => llama.createContext(opts, { gpu: 'vulkan' }),
      'ERR_INVALID_ARG',
      /unknown loadOptions gpu; the only one is gpuVariant/,
    );
    await rejects(
      () => llama.createContext(opts, { gpuVariant: 'metal' }),
      'ERR_INVALID_ARG',
      /loadOptions\.gpuVariant/,
    );
    await rejects(() => llama.createContext(opts, { gpuVariant: 1 }), 'ERR_INVALID_ARG', /got number/);
  });
});

describe('loader: resolution order (scratch package in a child process)', function () {
  this.timeout(60000);
  const KEY = platformKey();
  let dir;
  let pkg;

  /** A copy of the package's JS side (no build/, no node_modules/) under a fresh folder. */
  function scratchPackage() {
    const p = fs.mkdtempSync(path.join(dir, 'pkg-'));
    fs.cpSync(path.join(ROOT, 'lib'), path.join(p, 'lib'), { recursive: true });
    fs.cpSync(path.join(ROOT, 'scripts'), path.join(p, 'scripts'), { recursive: true });
    fs.copyFileSync(path.join(ROOT, 'package.json'), path.join(p, 'package.json'));
    // An installed package has its runtime dependencies beside it: link the repository's.
    for (const dep of Object.keys(require(path.join(ROOT, 'package.json')).dependencies || {})) {
      const link = path.join(p, 'node_modules', dep);
      fs.mkdirSync(path.dirname(link), { recursive: true });
      fs.symlinkSync(path.join(ROOT, 'node_modules', dep), link, 'dir');
    }
    return p;
  }

  /** A platform package `name` in `p`'s node_modules holding a copy of the source build. */
  function fakePlatformPackage(p, name, { withBinary = true } = {}) {
    const d = path.join(p, 'node_modules', name);
    fs.mkdirSync(d, { recursive: true });
    const main = `llama_branch.${KEY}.node`;
    fs.writeFileSync(path.join(d, 'package.json'), JSON.stringify({ name, version: '0.0.0', main }));
    if (withBinary) fs.copyFileSync(SOURCE_BUILD, path.join(d, main));
    return path.join(d, main);
  }

  /** A copy of the source build in `p`/build (or `p`/build/`sub`), recorded as built with `features`. */
  function fakeSourceBuild(p, features = [], sub = '') {
    const d = path.join(p, 'build', sub);
    fs.mkdirSync(d, { recursive: true });
    fs.copyFileSync(SOURCE_BUILD, path.join(d, 'llama_branch.node'));
    fs.writeFileSync(path.join(d, 'llama_branch.json'), JSON.stringify({ features, cpu: 'native' }));
    return path.join(d, 'llama_branch.node');
  }

  /** Loads `p` in a child; returns { code, message } of the error, or { binaries } (.node files loaded). */
  function load(p, { variant, env = {} } = {}) {
    const program = `
      try {
        const llama = require(${JSON.stringify(p)});
        ${variant ? `llama.loadBinary(${JSON.stringify(variant)});` : ''}
        llama.systemInfo();
        console.log(JSON.stringify({ binaries: Object.keys(require.cache).filter((f) => f.endsWith('.node')) }));
      } catch (e) {
        console.log(JSON.stringify({ code: e.code, message: e.message }));
      }`;
    const base = { ...process.env };
    delete base.LLAMA_BRANCH_BINARY;
    const res = spawnSync(process.execPath, ['-e', program], { env: { ...base, ...env }, encoding: 'utf8' });
    assert.equal(res.status, 0, `the child died: ${res.stderr}`);
    return JSON.parse(res.stdout.trim().split('\n').pop());
  }

  before(function () {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-loader-'));
  });
  after(function () {
    fs.rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(function () {
    pkg = scratchPackage();
  });

  it('nothing installed: ERR_NATIVE_LOAD listing each place and what to do', function () {
    const r = load(pkg);
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(r.message, /source build build\/llama_branch\.node: not built/);
    assert.match(r.message, new RegExp(`platform package ${platformPackageName(null)}: not installed`));
    assert.match(r.message, /npm install llama-branch, without --omit=optional/);
    assert.match(r.message, /LLAMA_BRANCH_BUILD_FROM_SOURCE=1 npm rebuild llama-branch/);
    assert.match(r.message, /LLAMA_BRANCH_BINARY/);
  });

  it('the platform package when there is no source build', function () {
    const binary = fakePlatformPackage(pkg, platformPackageName(null));
    assert.deepEqual(load(pkg).binaries, [fs.realpathSync(binary)]);
  });

  it('the source build before the platform package', function () {
    fakePlatformPackage(pkg, platformPackageName(null));
    const source = fakeSourceBuild(pkg);
    assert.deepEqual(load(pkg).binaries, [fs.realpathSync(source)]);
  });

  it('LLAMA_BRANCH_BINARY before both, and never replaced by them when it fails', function () {
    fakePlatformPackage(pkg, platformPackageName(null));
    fakeSourceBuild(pkg);
    const explicit = path.join(dir, 'explicit.node');
    fs.copyFileSync(SOURCE_BUILD, explicit);
    assert.deepEqual(load(pkg, { env: { LLAMA_BRANCH_BINARY: explicit } }).binaries, [fs.realpathSync(explicit)]);
    const r = load(pkg, { env: { LLAMA_BRANCH_BINARY: path.join(dir, 'missing.node') } });
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(r.message, /LLAMA_BRANCH_BINARY \(.*missing\.node\)/);
    assert.doesNotMatch(r.message, /platform package/);
  });

  it('a platform package without its binary, or a file that is not an addon: ERR_NATIVE_LOAD with the reason', function () {
    fakePlatformPackage(pkg, platformPackageName(null), { withBinary: false });
    let r = load(pkg);
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(
      r.message,
      new RegExp(
        `platform package ${platformPackageName(null)}: llama_branch\\.${KEY}\\.node is missing from the package`,
      ),
    );
    const notAnAddon = path.join(dir, 'not-an-addon.node');
    fs.writeFileSync(notAnAddon, 'this is not a shared library');
    r = load(pkg, { env: { LLAMA_BRANCH_BINARY: notAnAddon } });
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(r.message, /not-an-addon\.node\): .*(invalid ELF header|file too short)/);
  });

  it('a GPU variant comes from llama-branch-<platform>-<variant>, or a source build with that feature', function () {
    const gpuBinary = fakePlatformPackage(pkg, platformPackageName('cuda'));
    const defaultBinary = fakePlatformPackage(pkg, platformPackageName(null));
    assert.deepEqual(
      load(pkg, { variant: 'cuda' }).binaries.sort(),
      [fs.realpathSync(defaultBinary), fs.realpathSync(gpuBinary)].sort(),
    );
    // Vulkan ships as a module package the prebuilt loads: a platform package that is no prebuilt
    // (here a source build's copy) gives no Vulkan, and says so.
    const r0 = load(pkg, { variant: 'vulkan' });
    assert.equal(r0.code, 'ERR_NATIVE_LOAD');
    assert.match(
      r0.message,
      new RegExp(`the prebuilt ${platformPackageName(null)} with ${platformPackageName('vulkan')} .*not a prebuilt`),
    );

    const other = scratchPackage();
    const source = fakeSourceBuild(other, ['vulkan']);
    assert.deepEqual(load(other, { variant: 'vulkan' }).binaries, [fs.realpathSync(source)]);
    const r = load(other, { variant: 'cuda' });
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(r.message, /built without the cuda feature \(features: vulkan\)/);
  });

  it('a GPU source build kept beside the CPU one (build/<variant>/) comes first, and loads beside it', function () {
    const cpu = fakeSourceBuild(pkg, []);
    const beside = fakeSourceBuild(pkg, ['vulkan'], 'vulkan');
    fakePlatformPackage(pkg, platformPackageName('vulkan'));
    // Both static builds are loaded in one process: the default one by require, the other by loadBinary.
    assert.deepEqual(
      load(pkg, { variant: 'vulkan' }).binaries.sort(),
      [fs.realpathSync(cpu), fs.realpathSync(beside)].sort(),
    );
    const other = scratchPackage();
    fakeSourceBuild(other, []);
    fakeSourceBuild(other, ['cuda'], 'vulkan');
    const r = load(other, { variant: 'vulkan' });
    assert.equal(r.code, 'ERR_NATIVE_LOAD');
    assert.match(
      r.message,
      /source build build\/vulkan\/llama_branch\.node: built without the vulkan feature \(features: cuda\)/,
    );
    assert.match(r.message, /npm run build -- --out build\/vulkan/);
  });

  it('install script: skips the build when the platform package loads, builds when forced', function () {
    fakePlatformPackage(pkg, platformPackageName(null));
    const env = { ...process.env, CARGO_HOME: path.join(dir, 'no-cargo'), PATH: path.dirname(process.execPath) };
    delete env.LLAMA_BRANCH_BINARY;
    delete env.LLAMA_BRANCH_SKIP_BUILD;
    const skipped = spawnSync(process.execPath, [path.join(pkg, 'scripts', 'build.js')], {
      cwd: pkg,
      env,
      encoding: 'utf8',
    });
    assert.equal(skipped.status, 0, skipped.stderr);
    assert.match(
      skipped.stderr,
      new RegExp(`using the prebuilt binary from ${platformPackageName(null)}; nothing to compile`),
    );
    assert.ok(!fs.existsSync(path.join(pkg, 'build')), 'nothing may be built');

    const forced = spawnSync(process.execPath, [path.join(pkg, 'scripts', 'build.js')], {
      cwd: pkg,
      env: { ...env, LLAMA_BRANCH_BUILD_FROM_SOURCE: '1' },
      encoding: 'utf8',
    });
    assert.notEqual(forced.status, 0);
    assert.match(forced.stderr, /LLAMA_BRANCH_BUILD_FROM_SOURCE=1: building from source/);
    assert.match(forced.stderr, /the Rust toolchain \(cargo\) was not found/);
  });
});
