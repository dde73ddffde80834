'use strict';

/**
 * What a build with the `vulkan` cargo feature needs on Linux, found or installed:
 *   - the Vulkan loader to link (libvulkan.so, Debian package libvulkan-dev);
 *   - `glslc`, which compiles ggml's compute shaders at build time (package glslc);
 *   - SPIRV-Headers' CMake package, which ggml-vulkan's CMakeLists asks for (spirv-headers);
 *   - Vulkan headers new enough for ggml-vulkan. Debian 12 ships 1.3.239, which lacks
 *     VK_EXT_layer_settings and more; the next release's libvulkan-dev (1.4.309) is known to work.
 *     Its headers are plain files, so they are fetched with apt from that release into a private
 *     apt state (nothing is installed or upgraded on the system), unpacked into the cache folder
 *     and handed to CMake through CMAKE_PREFIX_PATH, while linking stays on the system's loader.
 *
 * `prepareVulkanBuild` (scripts/build.js, LLAMA_BRANCH_FEATURES=vulkan) only checks and says what
 * to install; `installVulkanBuild` (`node scripts/vulkan.js`, scripts/test-gpu.js) installs the
 * packages with apt and fetches the headers. A VULKAN_SDK in the environment (LunarG's SDK) is
 * used as is and nothing is checked. scripts/test-gpu.js also installs a Vulkan driver to test
 * on (Mesa's software device, lavapipe) when none exists.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { which, run, hasApt, logger, aptCommand, aptInstall } = require('./env');

/** Oldest Vulkan header version known to build the vendored ggml-vulkan (tested here). */
const MIN_HEADER = [1, 4, 309];
/** Debian release whose libvulkan-dev provides such headers, per release too old for them. */
const NEWER_HEADERS_FROM = { bookworm: 'trixie' };
const BUILD_PACKAGES = ['glslc', 'libvulkan-dev', 'spirv-headers'];
/** Mesa's Vulkan drivers, lavapipe (a software device) among them. */
const DRIVER_PACKAGES = ['mesa-vulkan-drivers'];

const log = logger('llama-branch');

function cacheRoot() {
  return path.join(os.homedir() || os.tmpdir(), '.cache', 'llama-branch');
}

const aptEnv = () => ({ ...process.env, DEBIAN_FRONTEND: 'noninteractive' });

/** Library folders of this system (multiarch first). */
function libDirs() {
  const dirs = [];
  for (const base of ['/usr/lib', '/lib']) {
    try {
      for (const name of fs.readdirSync(base)) if (/-linux-(gnu|musl)/.test(name)) dirs.push(path.join(base, name));
    } catch {
      // no such folder
    }
  }
  return [...dirs, '/usr/lib64', '/usr/lib', '/usr/local/lib'];
}

function hasVulkanLoader() {
  return libDirs().some((d) => fs.existsSync(path.join(d, 'libvulkan.so')));
}

function hasSpirvHeaders() {
  const roots = ['/usr/share/cmake', '/usr/local/share/cmake', ...libDirs().map((d) => path.join(d, 'cmake'))];
  return roots.some((r) => fs.existsSync(path.join(r, 'SPIRV-Headers', 'SPIRV-HeadersConfig.cmake')));
}

/** [major, minor, patch] of the Vulkan headers under `includeDir`, or null. */
function headerVersion(includeDir) {
  let text;
  try {
    text = fs.readFileSync(path.join(includeDir, 'vulkan', 'vulkan_core.h'), 'utf8');
  } catch {
    return null;
  }
  const patch = /#define VK_HEADER_VERSION (\d+)/.exec(text);
  const complete = /#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\s*0,\s*(\d+),\s*(\d+),/.exec(text);
  if (!patch || !complete) return null;
  return [Number(complete[1]), Number(complete[2]), Number(patch[1])];
}

function atLeast(version, min) {
  if (!version) return false;
  for (let i = 0; i < min.length; i++) if (version[i] !== min[i]) return version[i] > min[i];
  return true;
}

const showVersion = (v) => (v ? v.join('.') : 'none');

/** Codename of this Debian release (e.g. bookworm), or null. */
function debianCodename() {
  try {
    const text = fs.readFileSync('/etc/os-release', 'utf8');
    const m = /^VERSION_CODENAME=(\S+)/m.exec(text);
    return m ? m[1].replace(/"/g, '') : null;
  } catch {
    return null;
  }
}

/** What the build lacks, as human-readable lines (empty when everything is there). */
function missingBuildParts() {
  const missing = [];
  if (!which('glslc')) missing.push('glslc (compiles the Vulkan shaders; package glslc)');
  if (!hasVulkanLoader()) missing.push('the Vulkan loader libvulkan.so (package libvulkan-dev)');
  if (!hasSpirvHeaders()) missing.push('SPIRV-Headers for CMake (package spirv-headers)');
  if (!headerVersion('/usr/include')) missing.push('the Vulkan headers (package libvulkan-dev)');
  return missing;
}

/**
 * Fetches libvulkan-dev of Debian `release` with a private apt state (signed by the keys of
 * debian-archive-keyring) and unpacks its include folder into the cache. Returns the prefix
 * to give CMake, or null with a logged reason.
 */
function fetchNewerHeaders(release) {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-vulkan-'));
  try {
    for (const d of ['lists/partial', 'cache/archives/partial', 'deb', 'unpacked'])
      fs.mkdirSync(path.join(work, d), { recursive: true });
    const sources = path.join(work, 'sources.list');
    fs.writeFileSync(
      sources,
      `deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian ${release} main\n`,
    );
    const opts = [
      `-o`,
      `Dir::Etc::SourceList=${sources}`,
      `-o`,
      `Dir::Etc::SourceParts=/dev/null`,
      `-o`,
      `Dir::State::Lists=${path.join(work, 'lists')}`,
      `-o`,
      `Dir::Cache=${path.join(work, 'cache')}`,
      `-o`,
      `APT::Sandbox::User=${os.userInfo().username}`,
      `-o`,
      `Debug::NoLocking=1`,
    ];
    log(`fetching the Vulkan headers of Debian ${release} (libvulkan-dev; only its header files are used)`);
    const quiet = { env: aptEnv(), stdio: ['ignore', 'ignore', 'inherit'] };
    if (run('apt-get', [...opts, 'update'], quiet) !== 0) {
      log(`could not read Debian ${release}'s package lists`);
      return null;
    }
    if (run('apt-get', [...opts, 'download', 'libvulkan-dev'], { ...quiet, cwd: path.join(work, 'deb') }) !== 0) {
      log(`could not download libvulkan-dev from Debian ${release}`);
      return null;
    }
    const deb = fs.readdirSync(path.join(work, 'deb')).find((f) => f.endsWith('.deb'));
    if (!deb || run('dpkg', ['-x', path.join(work, 'deb', deb), path.join(work, 'unpacked')]) !== 0) {
      log('could not unpack libvulkan-dev');
      return null;
    }
    const include = path.join(work, 'unpacked', 'usr', 'include');
    const version = headerVersion(include);
    if (!version || !atLeast(version, MIN_HEADER)) {
      log(`Debian ${release}'s Vulkan headers are ${showVersion(version)}, older than ${showVersion(MIN_HEADER)}`);
      return null;
    }
    const prefix = path.join(cacheRoot(), `vulkan-headers-${version.join('.')}`);
    fs.rmSync(prefix, { recursive: true, force: true });
    fs.mkdirSync(prefix, { recursive: true });
    fs.cpSync(include, path.join(prefix, 'include'), { recursive: true });
    return prefix;
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/** A cached header prefix from an earlier fetch that is new enough, or null. */
function cachedHeaders() {
  let names = [];
  try {
    names = fs.readdirSync(cacheRoot()).filter((n) => n.startsWith('vulkan-headers-'));
  } catch {
    return null;
  }
  for (const name of names.sort().reverse()) {
    const prefix = path.join(cacheRoot(), name);
    const v = headerVersion(path.join(prefix, 'include'));
    if (v && atLeast(v, MIN_HEADER)) return prefix;
  }
  return null;
}

function fail(lines) {
  console.error(`\n[llama-branch] ERROR: cannot build the Vulkan backend:\n${lines.map((l) => `  ${l}\n`).join('')}`);
  process.exit(1);
}

/**
 * Checks that the Vulkan build can run; returns environment variables to add to the cargo call.
 * Installs nothing (this runs inside `npm install`): exits with what to run when a part is missing.
 */
function prepareVulkanBuild() {
  if (process.env.VULKAN_SDK) {
    log(`Vulkan: using VULKAN_SDK=${process.env.VULKAN_SDK}`);
    return {};
  }
  const env = vulkanBuildEnv();
  if (env) return env;
  if (process.platform !== 'linux')
    fail(['on this platform install the LunarG Vulkan SDK and set VULKAN_SDK (https://vulkan.lunarg.com/)']);
  const missing = missingBuildParts();
  const system = headerVersion('/usr/include');
  fail([
    ...(missing.length ? ['missing:', ...missing.map((m) => `  - ${m}`)] : []),
    ...(missing.length || !hasApt()
      ? []
      : [
          `the Vulkan headers in /usr/include are ${showVersion(system)}; ggml's Vulkan backend needs ${showVersion(MIN_HEADER)} or newer.`,
        ]),
    hasApt()
      ? `run \`node scripts/vulkan.js\` (installs ${BUILD_PACKAGES.join(' ')} with apt and fetches newer headers), or: ${aptCommand(BUILD_PACKAGES)}`
      : 'install them with your package manager, or set VULKAN_SDK; newer headers go in PREFIX/include with CMAKE_PREFIX_PATH=PREFIX',
  ]);
}

/**
 * The environment a Vulkan build needs when everything for it is here (VULKAN_SDK, or the
 * packages and new enough headers), else null. Installs and prints nothing but the headers' note.
 * @returns {Record<string, string> | null}
 */
function vulkanBuildEnv() {
  if (process.env.VULKAN_SDK) return {};
  if (process.platform !== 'linux' || missingBuildParts().length > 0) return null;
  const system = headerVersion('/usr/include');
  if (system && atLeast(system, MIN_HEADER)) return {};
  const headers = cachedHeaders();
  if (!headers) return null;
  log(`Vulkan: the system headers are ${showVersion(system)}; using ${headers}`);
  return { CMAKE_PREFIX_PATH: joinPrefix(headers) };
}

/** Installs what the Vulkan build needs (apt packages, newer headers into the cache); exits on failure. */
function installVulkanBuild() {
  if (process.env.VULKAN_SDK || process.platform !== 'linux') return;
  if (missingBuildParts().length > 0 && !aptInstall(BUILD_PACKAGES, log))
    fail([`could not install ${BUILD_PACKAGES.join(' ')}; run: ${aptCommand(BUILD_PACKAGES)}`]);
  const missing = missingBuildParts();
  if (missing.length > 0) fail(['still missing after apt-get install:', ...missing.map((m) => `  - ${m}`)]);
  if (atLeast(headerVersion('/usr/include'), MIN_HEADER) || cachedHeaders()) return;
  const release = NEWER_HEADERS_FROM[debianCodename()];
  if (!release || !which('apt-get') || !fetchNewerHeaders(release)) {
    fail([
      `no Vulkan headers ${showVersion(MIN_HEADER)} or newer could be fetched: install the LunarG SDK and set VULKAN_SDK`,
    ]);
  }
}

function joinPrefix(prefix) {
  return [prefix, process.env.CMAKE_PREFIX_PATH].filter(Boolean).join(';');
}

/** Number of Vulkan drivers (ICD manifests) installed. */
function driverCount() {
  const dirs = ['/usr/share/vulkan/icd.d', '/etc/vulkan/icd.d', '/usr/local/share/vulkan/icd.d'];
  let n = 0;
  for (const d of dirs) {
    try {
      n += fs.readdirSync(d).filter((f) => f.endsWith('.json')).length;
    } catch {
      // no such folder
    }
  }
  return n;
}

/**
 * Makes sure some Vulkan driver is installed to run on: when none is, installs Mesa's (lavapipe
 * is a software device that runs anywhere) as root with apt. Returns false when none can be had.
 */
function ensureVulkanDriver() {
  if (driverCount() > 0) return true;
  if (aptInstall(DRIVER_PACKAGES, log) && driverCount() > 0) return true;
  log(`no Vulkan driver is installed; install one (e.g. ${aptCommand(DRIVER_PACKAGES)})`);
  return false;
}

if (require.main === module) installVulkanBuild();

module.exports = { prepareVulkanBuild, vulkanBuildEnv, installVulkanBuild, ensureVulkanDriver };
