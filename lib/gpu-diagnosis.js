'use strict';

/**
 * Why the Vulkan backend module found no working device, in terms of the system library that is
 * missing and the command that installs it. ggml only learns that the Vulkan instance or device
 * could not be created; the usual causes are outside the process: no Vulkan loader
 * (libvulkan.so.1), an NVIDIA driver whose Vulkan ICD (libGLX_nvidia.so.0) cannot load because
 * libglvnd's libGLdispatch.so.0 is absent (common in slim containers), or a container started
 * by the NVIDIA container toolkit without the `graphics` capability (the driver's Vulkan and GL
 * libraries are then not mounted at all).
 *
 * `diagnoseVulkan(inputs)` is a pure function of what was read from the system, so it is tested
 * without a GPU (test/unit/gpu-diagnosis.test.js); `vulkanInputs()` reads those inputs here.
 * Node built-ins only: lib/loader.js uses this before any package is installed.
 */

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

/** ldconfig's architecture tag of this process's libraries (other architectures cannot load). */
const LDCONFIG_ARCH = { x64: /x86-64/, arm64: /AArch64/i };

/**
 * The library file names `ldconfig -p` lists for `arch` (process.arch): a Set of sonames such as
 * `libvulkan.so.1`.
 */
function parseLdconfig(text, arch = process.arch) {
  const names = new Set();
  const want = LDCONFIG_ARCH[arch];
  for (const line of String(text || '').split('\n')) {
    const m = /^\s+(\S+)\s+\(([^)]*)\)\s+=>/.exec(line);
    if (m && (!want || want.test(m[2]))) names.add(m[1]);
  }
  return names;
}

/**
 * One Vulkan ICD manifest (a JSON file under icd.d): `{ file, library }`, the library the loader
 * would open (`ICD.library_path`), or `library: null` when the file does not parse.
 */
function parseIcd(file, text) {
  try {
    const json = JSON.parse(text);
    const library = json && json.ICD && typeof json.ICD.library_path === 'string' ? json.ICD.library_path : null;
    return { file, library };
  } catch {
    return { file, library: null };
  }
}

const isNvidia = (icd) => icd.library !== null && /nvidia/i.test(path.basename(icd.library));

/** Whether `soname` can be found: listed by ldconfig or in an LD_LIBRARY_PATH folder. */
function present(soname, inputs) {
  if (inputs.libraries.has(soname)) return true;
  return (inputs.extraLibraries || []).includes(soname);
}

/**
 * What is missing for Vulkan, from what was read off the system:
 *   libraries       Set of sonames (parseLdconfig of `ldconfig -p`)
 *   extraLibraries  file names in LD_LIBRARY_PATH's folders (optional)
 *   icds            parsed ICD manifests ([parseIcd(file, text)])
 *   container       true inside a container (docker, podman, kubernetes)
 *   nvidiaDevice    true when an NVIDIA GPU is visible (/dev/nvidiactl, /proc/driver/nvidia)
 *   capabilities    NVIDIA_DRIVER_CAPABILITIES as set in the container (undefined: unset)
 *   apt             true where apt-get is the package manager
 * Returns findings `{ missing, why, fix }`, most fundamental first; empty when nothing explains
 * the failure (then the driver itself, or the device, is the suspect).
 */
function diagnoseVulkan(inputs) {
  const findings = [];
  const install = (apt, other) => (inputs.apt ? `sudo apt-get install -y ${apt}` : other);
  if (!present('libvulkan.so.1', inputs)) {
    findings.push({
      missing: 'libvulkan.so.1',
      why: 'the Vulkan loader library is not installed',
      fix: install('libvulkan1', 'install the Vulkan loader (Fedora: sudo dnf install -y vulkan-loader)'),
    });
  }
  const nvidiaIcds = inputs.icds.filter(isNvidia);
  for (const icd of nvidiaIcds) {
    const lib = path.basename(icd.library);
    const libPresent = path.isAbsolute(icd.library) ? inputs.fileExists(icd.library) : present(lib, inputs);
    if (!libPresent) {
      findings.push({
        missing: lib,
        why: `NVIDIA's Vulkan driver manifest ${icd.file} names ${icd.library}, which is not installed`,
        fix: inputs.container
          ? "the NVIDIA container toolkit mounts the driver's Vulkan libraries only with the graphics capability: start the container with -e NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics (or all)"
          : "install the NVIDIA driver's GL/Vulkan libraries (Debian/Ubuntu: libnvidia-gl-<driver version>)",
      });
    } else if (!present('libGLdispatch.so.0', inputs)) {
      findings.push({
        missing: 'libGLdispatch.so.0',
        why: `NVIDIA's Vulkan driver (${lib}) needs libglvnd's libGLdispatch.so.0, which is not installed`,
        fix: install('libglvnd0', 'install libglvnd (Fedora: sudo dnf install -y libglvnd)'),
      });
    }
  }
  if (inputs.icds.length === 0) {
    const caps = inputs.capabilities;
    if (inputs.container && inputs.nvidiaDevice && !/(^|,)\s*(graphics|all)\s*(,|$)/.test(caps || '')) {
      findings.push({
        missing: 'an NVIDIA Vulkan driver manifest (nvidia_icd.json)',
        why: `an NVIDIA GPU is visible in this container, but not its Vulkan driver (NVIDIA_DRIVER_CAPABILITIES=${caps === undefined ? 'unset, which means compute,utility' : caps})`,
        fix: 'start the container with -e NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics (or all) so the NVIDIA container toolkit mounts the Vulkan driver',
      });
    } else {
      findings.push({
        missing: 'a Vulkan driver (no ICD manifest in the icd.d folders)',
        why: 'no Vulkan driver is installed',
        fix: inputs.nvidiaDevice
          ? "install the NVIDIA driver's GL/Vulkan libraries (Debian/Ubuntu: libnvidia-gl-<driver version>)"
          : `install your GPU vendor's driver, or ${install('mesa-vulkan-drivers', "Mesa's Vulkan drivers")} for Mesa's (lavapipe is a software device ggml hides unless GGML_VK_VISIBLE_DEVICES names it)`,
      });
    }
  }
  return findings;
}

/** One line per finding, for messages: "libvulkan.so.1 is missing (why): fix". */
function describeFindings(findings) {
  return findings.map((f) => `${f.missing} is missing (${f.why}): ${f.fix}`).join('; ');
}

/** The folders the Vulkan loader reads ICD manifests from (VK_DRIVER_FILES / VK_ICD_FILENAMES replace them). */
function icdFiles(env) {
  const named = env.VK_DRIVER_FILES || env.VK_ICD_FILENAMES;
  if (named) return named.split(':').filter(Boolean);
  const dataDirs = (env.XDG_DATA_DIRS || '/usr/local/share:/usr/share').split(':').filter(Boolean);
  const dirs = ['/etc/vulkan/icd.d', ...dataDirs.map((d) => path.join(d, 'vulkan', 'icd.d'))];
  const files = [];
  for (const dir of dirs) {
    let names = [];
    try {
      names = fs.readdirSync(dir);
    } catch {
      continue; // the folder does not exist: no driver installed there
    }
    for (const name of names) if (name.endsWith('.json')) files.push(path.join(dir, name));
  }
  return files;
}

function readOr(file, fallback) {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return fallback;
  }
}

/** Reads diagnoseVulkan's inputs off this machine (Linux; elsewhere the library checks are skipped). */
function vulkanInputs(env = process.env) {
  const ldconfig = ['/sbin/ldconfig', '/usr/sbin/ldconfig', 'ldconfig']
    .map((cmd) => spawnSync(cmd, ['-p'], { encoding: 'utf8', timeout: 5000 }))
    .find((r) => r.status === 0);
  const extraLibraries = [];
  for (const dir of (env.LD_LIBRARY_PATH || '').split(':').filter(Boolean)) {
    try {
      extraLibraries.push(...fs.readdirSync(dir));
    } catch {
      // a folder on LD_LIBRARY_PATH that does not exist holds nothing
    }
  }
  const cgroup = readOr('/proc/1/cgroup', '');
  return {
    libraries: parseLdconfig(ldconfig ? ldconfig.stdout : ''),
    extraLibraries,
    // A manifest that cannot be read (e.g. VK_ICD_FILENAMES naming a file that is not there)
    // gives the loader no driver, so it counts as none.
    icds: icdFiles(env)
      .map((f) => [f, readOr(f, null)])
      .filter(([, text]) => text !== null)
      .map(([f, text]) => parseIcd(f, text)),
    container:
      fs.existsSync('/.dockerenv') ||
      fs.existsSync('/run/.containerenv') ||
      /docker|kubepods|containerd|lxc/.test(cgroup) ||
      env.container !== undefined,
    nvidiaDevice: fs.existsSync('/dev/nvidiactl') || fs.existsSync('/proc/driver/nvidia/version'),
    capabilities: env.NVIDIA_DRIVER_CAPABILITIES,
    apt: fs.existsSync('/usr/bin/apt-get'),
    fileExists: (f) => fs.existsSync(f),
    // Without ldconfig (not Linux, or a minimal image) nothing can be said about libraries.
    librariesKnown: Boolean(ldconfig),
  };
}

/** diagnoseVulkan on this machine; [] where the libraries cannot be listed (no ldconfig). */
function diagnoseVulkanHere(env = process.env) {
  const inputs = vulkanInputs(env);
  return inputs.librariesKnown ? diagnoseVulkan(inputs) : [];
}

module.exports = { parseLdconfig, parseIcd, diagnoseVulkan, describeFindings, vulkanInputs, diagnoseVulkanHere };
