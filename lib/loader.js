'use strict';

/**
 * Finds and loads the native addon. Three places can hold one, tried in this order:
 *
 *   1. LLAMA_BRANCH_BINARY: an explicit .node file. When set it is the only candidate (a
 *      binary the user named is never silently replaced by another one);
 *   2. a local source build: build/llama_branch.node in this package (scripts/build.js);
 *   3. the platform package: llama-branch-<platform> (e.g. llama-branch-linux-x64-gnu), an
 *      optional dependency holding a prebuilt .node and the shared libraries it needs.
 *
 * GPU variants ('cuda', 'vulkan') are looked up first in a source build kept beside the CPU one
 * (build/<variant>/llama_branch.node, from `npm run build -- --out build/<variant>` with that
 * feature), then in build/llama_branch.node when it was built with that cargo feature
 * (build/llama_branch.json records the features), then in the platform package
 * llama-branch-<platform>-<variant>. Builds that link llama.cpp statically (every source build)
 * can be loaded side by side in one process; prebuilt ones cannot (see loadFile). If nothing
 * loads, ERR_NATIVE_LOAD lists every candidate with the reason it failed and says how to get a
 * binary.
 *
 * Right after loading, the addon is told the folder it was loaded from: a prebuilt keeps ggml's
 * backend modules (one CPU backend per instruction-set level) there and loads the best one for
 * this CPU from it. A prebuilt then also loads the GPU backend modules shipped in their own
 * packages (llama-branch-<platform>-vulkan: libggml-vulkan.so) when they are installed; one that
 * fails (no libvulkan.so.1, no driver, no device) is recorded with its reason (`gpuModules()`),
 * and the CPU serves. With the Vulkan package installed, `loadBinary('vulkan')` is that prebuilt. No npm dependencies: the install script (scripts/build.js) uses this file
 * before any package is installed.
 */

const fs = require('node:fs');
const path = require('node:path');
const { makeError } = require('./errors');
const { diagnoseVulkanHere, describeFindings } = require('./gpu-diagnosis');

const PACKAGE_ROOT = path.join(__dirname, '..');
const PACKAGE_NAME = 'llama-branch';
/** Where scripts/build.js installs a source build (beside it, llama_branch.json records how it was built). */
const SOURCE_BUILD = path.join(PACKAGE_ROOT, 'build', 'llama_branch.node');

/** `variant` values meaning "the normal CPU resolution"; the rest are GPU builds. */
const DEFAULT_VARIANTS = new Set(['default', 'cpu']);
/** GPU variants, each a cargo feature of the crate and a platform package suffix. */
const GPU_VARIANTS = new Set(['cuda', 'vulkan']);
/** GPU variants published as a backend module for the prebuilt (a package of its own), not as a whole build. */
const PACKAGED_GPU_MODULES = ['vulkan'];

/**
 * The napi-rs name of a platform: linux-x64-gnu, linux-arm64-gnu, linux-x64-musl, darwin-arm64,
 * win32-x64-msvc, ...
 */
function platformKey(platform = process.platform, arch = process.arch) {
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`;
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

/** True on a musl libc (Alpine): glibc reports its version in the process report, musl does not. */
function isMusl() {
  try {
    const header =
      process.report &&
      /** @type {{ header?: { glibcVersionRuntime?: string } }} */ (process.report.getReport()).header;
    return !(header && header.glibcVersionRuntime);
  } catch {
    return false;
  }
}

/** npm name of the platform package holding the prebuilt binary for `variant` (null = CPU). */
function platformPackageName(variant = null, key = platformKey()) {
  return variant ? `${PACKAGE_NAME}-${key}-${variant}` : `${PACKAGE_NAME}-${key}`;
}

/** null for the default (CPU) resolution, else the GPU variant name; ERR_INVALID_ARG otherwise. */
function normalizeVariant(variant, where = 'loadBinary(variant)') {
  if (variant === undefined || variant === null) return null;
  if (typeof variant === 'string' && DEFAULT_VARIANTS.has(variant)) return null;
  if (typeof variant === 'string' && GPU_VARIANTS.has(variant)) return variant;
  const shown = typeof variant === 'string' ? `"${variant}"` : typeof variant;
  throw makeError('ERR_INVALID_ARG', `${where}: expected 'default', 'cpu', 'cuda' or 'vulkan', got ${shown}`);
}

/** The cargo features recorded in a source build's .json ([] when unknown or none). */
function buildFeatures(infoFile) {
  try {
    const info = JSON.parse(fs.readFileSync(infoFile, 'utf8'));
    return Array.isArray(info.features) ? info.features.map(String) : [];
  } catch {
    return [];
  }
}

/** The .node file of an installed platform package, or a reason why there is none. */
function findPlatformPackage(name) {
  return findPackageMain(name, /\.node$/, '.node file');
}

/**
 * The file named by `main` in installed package `name` when it matches `pattern` (`what` names
 * the kind in the reason), or a reason why there is none. The package is resolved from this
 * package's folder, as Node would resolve its dependency.
 */
function findPackageMain(name, pattern, what) {
  let manifest;
  try {
    manifest = require.resolve(`${name}/package.json`, { paths: [PACKAGE_ROOT] });
  } catch {
    return { file: null, reason: 'not installed' };
  }
  let main;
  try {
    main = JSON.parse(fs.readFileSync(manifest, 'utf8')).main;
  } catch (e) {
    return { file: null, reason: `unreadable package.json (${e.message})` };
  }
  if (typeof main !== 'string' || !pattern.test(main))
    return { file: null, reason: `its package.json names no ${what} in "main"` };
  const file = path.join(path.dirname(manifest), main);
  return fs.existsSync(file) ? { file } : { file: null, reason: `${main} is missing from the package` };
}

/** A source build at `file` as a candidate for `variant` (null = CPU): ruled out when missing or built without that feature. */
function sourceCandidate(file, variant) {
  const label = `source build ${path.relative(PACKAGE_ROOT, file).split(path.sep).join('/')}`;
  if (!fs.existsSync(file)) return { label, file: null, reason: 'not built' };
  const features = buildFeatures(file.replace(/\.node$/, '.json'));
  if (variant && !features.includes(variant)) {
    return {
      label,
      file: null,
      reason: `built without the ${variant} feature (features: ${features.length ? features.join(', ') : 'none'})`,
    };
  }
  return { label, file };
}

/**
 * Where to look for the binary of `variant`, in order, lazily (the platform package is only
 * looked up when nothing before it loaded): { label, file | null, reason? }. Entries without a
 * file were ruled out before loading; the reason says why.
 */
function* candidates(variant) {
  const explicit = process.env.LLAMA_BRANCH_BINARY;
  if (!variant && explicit) {
    yield { label: 'LLAMA_BRANCH_BINARY', file: path.resolve(explicit) };
    return;
  }
  if (variant) yield sourceCandidate(path.join(PACKAGE_ROOT, 'build', variant, path.basename(SOURCE_BUILD)), variant);
  yield sourceCandidate(SOURCE_BUILD, variant);
  if (variant && PACKAGED_GPU_MODULES.includes(variant)) {
    // The prebuilt loads the variant's module package itself: the variant is there when it loaded.
    const base = platformPackageName(null);
    const found = findPlatformPackage(base);
    yield {
      label: `the prebuilt ${base} with ${platformPackageName(variant)}`,
      file: found.file,
      reason: found.file ? undefined : `${base} ${found.reason}`,
      module: variant,
    };
    return;
  }
  const name = platformPackageName(variant);
  const found = findPlatformPackage(name);
  yield { label: `platform package ${name}`, file: found.file, reason: found.reason };
}

/** Loaded bindings by real path of their .node, so each file is loaded once. */
const loaded = new Map();

/**
 * GPU backend modules shipped in packages of their own, by variant: what loading each into the
 * prebuilt did. `LLAMA_BRANCH_GPU=cpu` (or `0`/`off`) skips them all.
 * @type {Map<string, { variant: string, package: string, file: string | null, loaded: boolean, devices: number, error: string | null, diagnosis: Array<{ missing: string, why: string, fix: string }> }>}
 */
const gpuModuleStatus = new Map();

/** The backend module file of package `name` (its package.json `main`), or why there is none. */
function findModulePackage(name) {
  return findPackageMain(name, /\.(so|dylib|dll)$/, 'a backend module');
}

/** Loads the installed GPU module packages into a prebuilt `binding` (once per process). */
function loadGpuModules(binding) {
  if (gpuModuleStatus.size > 0) return;
  const off = /^(cpu|0|off|false|none)$/i.test(process.env.LLAMA_BRANCH_GPU || '');
  for (const variant of PACKAGED_GPU_MODULES) {
    const name = platformPackageName(variant);
    const found = findModulePackage(name);
    const status = {
      variant,
      package: name,
      file: found.file,
      loaded: false,
      devices: 0,
      error: found.reason || null,
      diagnosis: [],
    };
    if (found.file && off) status.error = 'skipped: LLAMA_BRANCH_GPU is set to use the CPU only';
    else if (found.file) {
      const result = binding._loadBackendModule(found.file);
      Object.assign(status, { loaded: result.loaded, devices: result.devices, error: result.error || null });
      // ggml cannot tell a missing system library from a missing driver; name the library and
      // the command that installs it (only on this failure path: it runs ldconfig).
      if (variant === 'vulkan' && !(result.loaded && result.devices > 0)) status.diagnosis = diagnoseVulkanHere();
      if (
        !result.loaded &&
        variant === 'vulkan' &&
        /did not initialise/.test(status.error || '') &&
        status.diagnosis.length === 0
      )
        status.error += " (no working Vulkan driver: install your GPU vendor's driver, or mesa-vulkan-drivers)";
      if (result.loaded && result.devices === 0)
        status.error =
          variant === 'vulkan'
            ? 'the Vulkan module loaded but found no GPU (a CPU-type device such as lavapipe is hidden unless GGML_VK_VISIBLE_DEVICES names it)'
            : 'the module loaded but found no device';
    }
    gpuModuleStatus.set(variant, status);
  }
}

/** What happened to each GPU module package (see loadGpuModules); empty before a prebuilt loaded. */
function gpuModules() {
  return [...gpuModuleStatus.values()].map((s) => ({ ...s, diagnosis: s.diagnosis.map((f) => ({ ...f })) }));
}

/** A module's reason for being off, with the diagnosis's missing libraries and fixes when there are any. */
function moduleReason(status) {
  if (status.diagnosis.length === 0) return status.error;
  return `${status.error || 'no device works'}. ${describeFindings(status.diagnosis)}`;
}

/**
 * True for a build with llama.cpp in shared libraries next to the .node (a prebuilt): the
 * dynamic linker shares libraries by name across the process, so two such builds would run on
 * the first one's llama.cpp.
 */
function usesSharedLlama(dir) {
  try {
    return fs.readdirSync(dir).some((f) => /^(lib)?ggml-base\.(so|dylib|dll)/.test(f));
  } catch {
    return false;
  }
}

/**
 * Loads one .node file and points it at its backend folder. Throws a plain Error (with the
 * reason) when it cannot be loaded, loads no compute backend, or is a second prebuilt build.
 */
function loadFile(file) {
  const real = fs.realpathSync(file);
  const cached = loaded.get(real);
  if (cached) return cached;
  if (usesSharedLlama(path.dirname(real))) {
    const other = [...loaded.keys()].find((f) => usesSharedLlama(path.dirname(f)));
    if (other) {
      throw new Error(
        `another prebuilt build is already loaded in this process (${other}); two builds with shared llama.cpp libraries cannot run side by side. Use one build per process (the same gpuVariant everywhere, or LLAMA_BRANCH_BINARY)`,
      );
    }
  }
  const binding = require(real);
  const dir = path.dirname(real);
  const devices = binding._setBackendDir(dir);
  if (devices === 0) {
    throw new Error(
      `it loaded, but no llama.cpp compute backend did: ${dir} must hold the backend modules shipped with it (libggml-cpu-*.so next to the .node); reinstall the package that provides it`,
    );
  }
  loaded.set(real, binding);
  if (usesSharedLlama(dir) && typeof binding._loadBackendModule === 'function') loadGpuModules(binding);
  return binding;
}

/** What to do when no binary loads, for the message of ERR_NATIVE_LOAD. */
function remedy(variant) {
  const key = platformKey();
  if (variant) {
    const install = PACKAGED_GPU_MODULES.includes(variant)
      ? `Install the prebuilt's ${variant} module: npm install ${platformPackageName(variant)} (beside llama-branch, whose prebuilt ${platformPackageName(null)} loads it; where one is published for ${key}), `
      : `Install the ${variant} build, ${platformPackageName(variant)} (where one is published for ${key}), `;
    return (
      install +
      `or build it from source: LLAMA_BRANCH_FEATURES=${variant} LLAMA_BRANCH_BUILD_FROM_SOURCE=1 npm rebuild llama-branch ` +
      `(needs Rust, cmake, a C++ compiler, libclang and the ${variant === 'cuda' ? 'CUDA toolkit' : 'Vulkan headers, loader and glslc, which `node scripts/vulkan.js` installs'}; see docs/gpu-and-rpc.md), ` +
      `or keep the CPU build and add this one beside it: LLAMA_BRANCH_FEATURES=${variant} npm run build -- --out build/${variant} (in the package folder). ` +
      "Or use the CPU build: loadBinary() / gpuVariant 'default'."
    );
  }
  return (
    `Reinstall with optional dependencies enabled (npm install llama-branch, without --omit=optional or --no-optional), ` +
    `which installs the prebuilt ${platformPackageName(null)}; or build from source: ` +
    'LLAMA_BRANCH_BUILD_FROM_SOURCE=1 npm rebuild llama-branch (needs Rust, cmake, a C++ compiler and libclang; see the README, "Install"); ' +
    'or set LLAMA_BRANCH_BINARY to a llama-branch .node file.'
  );
}

/**
 * The native binding for `variant` ('default' | 'cpu' | undefined = the normal resolution;
 * 'cuda' | 'vulkan' = that GPU build). Throws ERR_NATIVE_LOAD, listing what was tried and why
 * each failed and what to do, when none loads; ERR_INVALID_ARG for an unknown variant.
 */
function loadBinary(variant) {
  const gpu = normalizeVariant(variant);
  const tried = [];
  for (const candidate of candidates(gpu)) {
    if (!candidate.file) {
      tried.push(`${candidate.label}: ${candidate.reason}`);
      continue;
    }
    try {
      const binding = loadFile(candidate.file);
      if (candidate.module) {
        const status = gpuModuleStatus.get(candidate.module);
        if (!status) throw new Error('that build is not a prebuilt: it loads no GPU module packages');
        if (!(status.loaded && status.devices > 0)) throw new Error(moduleReason(status) || 'the module did not load');
      }
      return binding;
    } catch (e) {
      tried.push(`${candidate.label} (${candidate.file}): ${String(e.message).split('\n')[0]}`);
    }
  }
  const what = gpu ? `the ${gpu} build of llama-branch` : 'the llama-branch native addon';
  throw makeError(
    'ERR_NATIVE_LOAD',
    `llama-branch: cannot load ${what} for ${platformKey()}. Tried:\n${tried.map((t) => `  - ${t}\n`).join('')}${remedy(gpu)}`,
  );
}

/**
 * Only the platform package's binary (for the install script's check whether a prebuilt fits
 * this machine): the binding and its file, or ERR_NATIVE_LOAD with the reason.
 */
function loadPlatformPackage(variant) {
  const gpu = normalizeVariant(variant);
  const name = platformPackageName(gpu);
  const found = findPlatformPackage(name);
  if (!found.file) throw makeError('ERR_NATIVE_LOAD', `${name}: ${found.reason}`);
  try {
    return { binding: loadFile(found.file), file: found.file, name };
  } catch (e) {
    throw makeError('ERR_NATIVE_LOAD', `${name} (${found.file}): ${String(e.message).split('\n')[0]}`);
  }
}

module.exports = {
  loadBinary,
  gpuModules,
  moduleReason,
  loadPlatformPackage,
  platformKey,
  platformPackageName,
  normalizeVariant,
  GPU_VARIANTS,
};
