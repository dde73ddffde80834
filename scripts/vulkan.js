'use strict';

/**
 * What a build with the `vulkan` cargo feature needs on Linux: glslc (compiles ggml's shaders), the
 * loader libvulkan.so, SPIRV-Headers' CMake package and Vulkan headers of MIN_HEADER or newer. Debian
 * 12's headers (1.3.239) lack VK_EXT_layer_settings and more, so on it trixie's libvulkan-dev is
 * downloaded with a private apt state (the system is left alone) and only its headers are used, from
 * the cache through CMAKE_PREFIX_PATH. prepareVulkanBuild (scripts/build.js, inside `npm install`)
 * only checks; installVulkanBuild (`node scripts/vulkan.js`, test/gpu/run.js) installs. A VULKAN_SDK
 * (LunarG's SDK) is used as is.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { which, run, hasApt, logger, aptCommand, aptInstall } = require('./env');

/** Oldest Vulkan header version known to build the vendored ggml-vulkan (tested here). */
const MIN_HEADER = [1, 4, 309];
/** Per Debian release with too old headers, the release whose libvulkan-dev has new enough ones. */
const NEWER_HEADERS_FROM = { bookworm: 'trixie' };
const BUILD_PACKAGES = ['glslc', 'libvulkan-dev', 'spirv-headers'];
/** Mesa's Vulkan drivers include lavapipe, a software device that runs anywhere. */
const DRIVER_PACKAGES = ['mesa-vulkan-drivers'];
const CACHE_DIR = path.join(os.homedir() || os.tmpdir(), '.cache', 'llama-branch');

const log = logger('llama-branch');
const showVersion = (v) => (v ? v.join('.') : 'none');
/** True for a [major, minor, patch] of MIN_HEADER or newer (the first differing part decides). */
const newEnough = (v) => Boolean(v) && (v[0] - MIN_HEADER[0] || v[1] - MIN_HEADER[1] || v[2] - MIN_HEADER[2]) >= 0;

/** `read()`, or `fallback` when it throws (a file or folder that is not there). */
function attempt(read, fallback) {
  try {
    return read();
  } catch {
    return fallback;
  }
}
const listDir = (dir) => attempt(() => fs.readdirSync(dir), []);

/** Library folders of this system, multiarch ones first. */
function libDirs() {
  const multiarch = ['/usr/lib', '/lib'].flatMap((base) =>
    listDir(base).flatMap((name) => (/-linux-(gnu|musl)/.test(name) ? [path.join(base, name)] : [])),
  );
  return [...multiarch, '/usr/lib64', '/usr/lib', '/usr/local/lib'];
}

/** [major, minor, patch] of the Vulkan headers under `includeDir`, or null. */
function headerVersion(includeDir) {
  const text = attempt(() => fs.readFileSync(path.join(includeDir, 'vulkan', 'vulkan_core.h'), 'utf8'), '');
  const patch = /#define VK_HEADER_VERSION (\d+)/.exec(text);
  const complete = /#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\s*0,\s*(\d+),\s*(\d+),/.exec(text);
  return patch && complete ? [Number(complete[1]), Number(complete[2]), Number(patch[1])] : null;
}

/** What the build lacks, as list items to print (empty when everything is there). */
function missingBuildParts() {
  const libs = libDirs();
  const anyHas = (dirs, file) => dirs.some((dir) => fs.existsSync(path.join(dir, file)));
  const cmakeDirs = ['/usr/share/cmake', '/usr/local/share/cmake', ...libs.map((d) => path.join(d, 'cmake'))];
  return [
    [which('glslc'), 'glslc (compiles the Vulkan shaders; package glslc)'],
    [anyHas(libs, 'libvulkan.so'), 'the Vulkan loader libvulkan.so (package libvulkan-dev)'],
    [anyHas(cmakeDirs, 'SPIRV-Headers/SPIRV-HeadersConfig.cmake'), 'SPIRV-Headers for CMake (package spirv-headers)'],
    [headerVersion('/usr/include'), 'the Vulkan headers (package libvulkan-dev)'],
  ].flatMap(([found, what]) => (found ? [] : [`  - ${what}`]));
}

/**
 * Downloads the libvulkan-dev of a newer Debian release (checked against debian-archive-keyring) and
 * copies its include folder into the cache, where cachedHeaders() finds it. Throws saying what failed.
 */
function fetchNewerHeaders() {
  const osRelease = attempt(() => fs.readFileSync('/etc/os-release', 'utf8'), '');
  const release = NEWER_HEADERS_FROM[/^VERSION_CODENAME="?([^"\s]+)/m.exec(osRelease)?.[1]];
  if (!release || !which('apt-get'))
    throw new Error(`they are fetched only on Debian ${Object.keys(NEWER_HEADERS_FROM).join(', ')}, with apt-get`);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-vulkan-'));
  const at = (...parts) => path.join(work, ...parts);
  try {
    for (const d of ['lists/partial', 'cache/archives/partial', 'deb', 'unpacked'])
      fs.mkdirSync(at(d), { recursive: true });
    const keyring = '/usr/share/keyrings/debian-archive-keyring.gpg';
    fs.writeFileSync(at('sources.list'), `deb [signed-by=${keyring}] http://deb.debian.org/debian ${release} main\n`);
    // An apt state of its own: reads only this source, writes only under `work`, needs no root or lock.
    const options = [
      `Dir::Etc::SourceList=${at('sources.list')}`,
      'Dir::Etc::SourceParts=/dev/null',
      `Dir::State::Lists=${at('lists')}`,
      `Dir::Cache=${at('cache')}`,
      `APT::Sandbox::User=${os.userInfo().username}`,
      'Debug::NoLocking=1',
    ].flatMap((option) => ['-o', option]);
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const apt = (...args) =>
      run('apt-get', [...options, ...args], { cwd: at('deb'), env, stdio: ['ignore', 'ignore', 'inherit'] }) === 0;
    log(`fetching the Vulkan headers of Debian ${release} (libvulkan-dev; only its header files are used)`);
    if (!apt('update')) throw new Error(`could not read Debian ${release}'s package lists`);
    if (!apt('download', 'libvulkan-dev')) throw new Error(`could not download libvulkan-dev from Debian ${release}`);
    const deb = listDir(at('deb')).find((f) => f.endsWith('.deb'));
    if (!deb || run('dpkg', ['-x', at('deb', deb), at('unpacked')]) !== 0)
      throw new Error('could not unpack libvulkan-dev');
    const include = at('unpacked', 'usr', 'include');
    const version = headerVersion(include);
    if (!newEnough(version)) throw new Error(`Debian ${release}'s Vulkan headers are ${showVersion(version)}`);
    const prefix = path.join(CACHE_DIR, `vulkan-headers-${version.join('.')}`);
    fs.rmSync(prefix, { recursive: true, force: true });
    fs.cpSync(include, path.join(prefix, 'include'), { recursive: true });
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/** The newest new enough header prefix fetched earlier, or null. */
function cachedHeaders() {
  const names = listDir(CACHE_DIR).filter((name) => name.startsWith('vulkan-headers-'));
  const found = names
    .sort()
    .reverse()
    .find((name) => newEnough(headerVersion(path.join(CACHE_DIR, name, 'include'))));
  return found ? path.join(CACHE_DIR, found) : null;
}

function fail(...lines) {
  console.error(`\n[llama-branch] ERROR: cannot build the Vulkan backend:\n${lines.map((l) => `  ${l}\n`).join('')}`);
  process.exit(1);
}

/** Environment variables for the cargo call; exits saying what to install when a part is missing. */
function prepareVulkanBuild() {
  if (process.env.VULKAN_SDK) log(`Vulkan: using VULKAN_SDK=${process.env.VULKAN_SDK}`);
  const env = vulkanBuildEnv();
  if (env) return env;
  if (process.platform !== 'linux')
    fail('on this platform install the LunarG Vulkan SDK and set VULKAN_SDK (https://vulkan.lunarg.com/)');
  const missing = missingBuildParts();
  const system = showVersion(headerVersion('/usr/include'));
  // Nothing missing means the system headers are too old and none are cached.
  const problem = missing.length
    ? ['missing:', ...missing]
    : [`the Vulkan headers in /usr/include are ${system}; ggml-vulkan needs ${showVersion(MIN_HEADER)} or newer`];
  const fix = hasApt()
    ? `run \`node scripts/vulkan.js\` (installs ${BUILD_PACKAGES.join(' ')} with apt and fetches newer headers), or: ${aptCommand(BUILD_PACKAGES)}`
    : 'install them with your package manager, or set VULKAN_SDK; newer headers go in PREFIX/include with CMAKE_PREFIX_PATH=PREFIX';
  fail(...problem, fix);
}

/** @returns {Record<string, string> | null} what a Vulkan build needs in its environment, or null if not here */
function vulkanBuildEnv() {
  if (process.env.VULKAN_SDK) return {};
  if (process.platform !== 'linux' || missingBuildParts().length > 0) return null;
  const system = headerVersion('/usr/include');
  if (newEnough(system)) return {};
  const headers = cachedHeaders();
  if (!headers) return null;
  log(`Vulkan: the system headers are ${showVersion(system)}; using ${headers}`);
  return { CMAKE_PREFIX_PATH: [headers, process.env.CMAKE_PREFIX_PATH].filter(Boolean).join(';') };
}

/** Installs what the Vulkan build needs (apt packages, newer headers into the cache); exits on failure. */
function installVulkanBuild() {
  if (process.env.VULKAN_SDK || process.platform !== 'linux') return;
  if (missingBuildParts().length > 0 && !aptInstall(BUILD_PACKAGES, log))
    fail(`could not install ${BUILD_PACKAGES.join(' ')}; run: ${aptCommand(BUILD_PACKAGES)}`);
  const missing = missingBuildParts();
  if (missing.length > 0) fail('still missing after apt-get install:', ...missing);
  if (newEnough(headerVersion('/usr/include')) || cachedHeaders()) return;
  try {
    fetchNewerHeaders();
  } catch (err) {
    fail(
      `no Vulkan headers ${showVersion(MIN_HEADER)}+ could be fetched (${err.message}); install the LunarG SDK and set VULKAN_SDK`,
    );
  }
}

/** Makes sure a Vulkan driver is installed to test on, else installs Mesa's; false when none can be had. */
function ensureVulkanDriver() {
  const icdDirs = ['/usr/share/vulkan/icd.d', '/etc/vulkan/icd.d', '/usr/local/share/vulkan/icd.d'];
  const hasDriver = () => icdDirs.some((dir) => listDir(dir).some((f) => f.endsWith('.json')));
  if (hasDriver() || (aptInstall(DRIVER_PACKAGES, log) && hasDriver())) return true;
  log(`no Vulkan driver is installed; install one (e.g. ${aptCommand(DRIVER_PACKAGES)})`);
  return false;
}

if (require.main === module) installVulkanBuild();

module.exports = { prepareVulkanBuild, vulkanBuildEnv, installVulkanBuild, ensureVulkanDriver };
