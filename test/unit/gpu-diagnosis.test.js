'use strict';

// The Vulkan diagnosis of `llama-branch devices` (lib/gpu-diagnosis.js) on recorded system
// inputs: `ldconfig -p` listings and ICD manifests as they look on the machines where each
// failure happens, so every branch is checked without a GPU.

const assert = require('node:assert/strict');
const { parseLdconfig, parseIcd, diagnoseVulkan, describeFindings, vulkanInputs } = require('../../lib/gpu-diagnosis');

/** An `ldconfig -p` listing with these x86-64 libraries (and an i386 libvulkan, which must not count). */
function ldconfig(names) {
  const lines = [`${names.length + 1} libs found in cache \`/etc/ld.so.cache'`];
  for (const n of names) lines.push(`\t${n} (libc6,x86-64) => /lib/x86_64-linux-gnu/${n}`);
  lines.push('\tlibvulkan.so.1 (libc6) => /lib/i386-linux-gnu/libvulkan.so.1');
  return lines.join('\n');
}

const NVIDIA_ICD = parseIcd(
  '/usr/share/vulkan/icd.d/nvidia_icd.json',
  JSON.stringify({ file_format_version: '1.0.1', ICD: { library_path: 'libGLX_nvidia.so.0', api_version: '1.4.312' } }),
);
const LVP_ICD = parseIcd(
  '/usr/share/vulkan/icd.d/lvp_icd.x86_64.json',
  JSON.stringify({ ICD: { library_path: '/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so', api_version: '1.3.255' } }),
);

/** diagnoseVulkan's inputs for a host (apt, no container) with `libs` and `icds`; `more` overrides. */
function inputs(libs, icds, more = {}) {
  return {
    libraries: parseLdconfig(ldconfig(libs), 'x64'),
    extraLibraries: [],
    icds,
    container: false,
    nvidiaDevice: false,
    capabilities: undefined,
    apt: true,
    fileExists: () => true,
    ...more,
  };
}

const BASE = ['libc.so.6', 'libm.so.6', 'libstdc++.so.6'];

describe('Vulkan diagnosis (lib/gpu-diagnosis.js)', function () {
  it('parses ldconfig -p for this architecture only', () => {
    const names = parseLdconfig(ldconfig(['libvulkan.so.1', 'libz.so.1']), 'x64');
    assert.deepEqual([...names].sort(), ['libvulkan.so.1', 'libz.so.1']);
    assert.ok(!parseLdconfig(ldconfig(['libz.so.1']), 'x64').has('libvulkan.so.1'), 'the i386 copy does not count');
    assert.ok(parseLdconfig(ldconfig(['libz.so.1']), 'arm64').size === 0, 'x86-64 libraries do not count on arm64');
  });

  it('parses ICD manifests, and a broken one as naming no library', () => {
    assert.deepEqual(NVIDIA_ICD, { file: '/usr/share/vulkan/icd.d/nvidia_icd.json', library: 'libGLX_nvidia.so.0' });
    assert.equal(parseIcd('/x.json', '{not json').library, null);
    assert.equal(parseIcd('/x.json', '{"ICD":{}}').library, null);
  });

  it('no libvulkan.so.1: names it and apt-get install libvulkan1', () => {
    const found = diagnoseVulkan(inputs(BASE, [LVP_ICD]));
    assert.equal(found.length, 1);
    assert.equal(found[0].missing, 'libvulkan.so.1');
    assert.equal(found[0].fix, 'sudo apt-get install -y libvulkan1');
    // found on LD_LIBRARY_PATH instead of ldconfig's cache: not missing
    assert.deepEqual(diagnoseVulkan(inputs(BASE, [LVP_ICD], { extraLibraries: ['libvulkan.so.1'] })), []);
  });

  it("NVIDIA's ICD without libglvnd (the H200 container of issue 39): libGLdispatch.so.0 and libglvnd0", () => {
    const libs = [...BASE, 'libvulkan.so.1', 'libGLX_nvidia.so.0', 'libnvidia-glcore.so.580.159.04'];
    const found = diagnoseVulkan(
      inputs(libs, [NVIDIA_ICD], { container: true, nvidiaDevice: true, capabilities: 'all' }),
    );
    assert.equal(found.length, 1, JSON.stringify(found));
    assert.equal(found[0].missing, 'libGLdispatch.so.0');
    assert.match(found[0].why, /libGLX_nvidia\.so\.0/);
    assert.equal(found[0].fix, 'sudo apt-get install -y libglvnd0');
    assert.match(
      describeFindings(found),
      /^libGLdispatch\.so\.0 is missing \(.*\): sudo apt-get install -y libglvnd0$/,
    );
    // with libglvnd installed, nothing is missing
    assert.deepEqual(
      diagnoseVulkan(inputs([...libs, 'libGLdispatch.so.0'], [NVIDIA_ICD], { container: true, nvidiaDevice: true })),
      [],
    );
  });

  it('an NVIDIA GPU in a container without the graphics capability: the toolkit setting', () => {
    for (const capabilities of [undefined, 'compute,utility']) {
      const found = diagnoseVulkan(
        inputs([...BASE, 'libvulkan.so.1'], [], { container: true, nvidiaDevice: true, capabilities }),
      );
      assert.equal(found.length, 1, JSON.stringify(found));
      assert.match(found[0].fix, /NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics/);
    }
    // the manifest is mounted but its library is not (a partly mounted driver)
    const found = diagnoseVulkan(
      inputs([...BASE, 'libvulkan.so.1'], [NVIDIA_ICD], {
        container: true,
        nvidiaDevice: true,
        capabilities: 'compute',
      }),
    );
    assert.equal(found.length, 1, JSON.stringify(found));
    assert.equal(found[0].missing, 'libGLX_nvidia.so.0');
    assert.match(found[0].fix, /graphics capability/);
  });

  it('outside a container a missing NVIDIA ICD library points at the driver package', () => {
    const found = diagnoseVulkan(inputs([...BASE, 'libvulkan.so.1'], [NVIDIA_ICD]));
    assert.equal(found[0].missing, 'libGLX_nvidia.so.0');
    assert.match(found[0].fix, /libnvidia-gl-/);
  });

  // Read at load time, so that a machine without ldconfig names the reason in the test's title;
  // in CI (Debian, where ldconfig is always there) the test runs and fails without it.
  const here = vulkanInputs({ ...process.env, VK_ICD_FILENAMES: '/nonexistent/none.json' });
  const readable = here.librariesKnown || process.env.CI === 'true';
  it(`reads this machine: the live inputs agree with the findings${readable ? '' : ' (not run here: no ldconfig to read)'}`, function () {
    if (!readable) return assert.equal(here.librariesKnown, false);
    assert.ok(here.librariesKnown, 'ldconfig -p answered');
    assert.ok(here.libraries.has('libc.so.6'), 'ldconfig -p lists libc');
    assert.deepEqual(here.icds, [], 'a manifest that is not there is no driver');
    const found = diagnoseVulkan(here).map((f) => f.missing);
    assert.equal(found.includes('libvulkan.so.1'), !here.libraries.has('libvulkan.so.1'), found.join(', '));
    assert.ok(
      found.some((m) => /Vulkan driver/.test(m)),
      found.join(', '),
    );
  });

  it('no driver at all: the vendor driver or mesa-vulkan-drivers; several findings in order', () => {
    const found = diagnoseVulkan(inputs(BASE, []));
    assert.deepEqual(
      found.map((f) => f.missing),
      ['libvulkan.so.1', 'a Vulkan driver (no ICD manifest in the icd.d folders)'],
    );
    assert.match(found[1].fix, /sudo apt-get install -y mesa-vulkan-drivers/);
  });

  it('without apt the fixes name the other package managers; a working setup finds nothing', () => {
    const found = diagnoseVulkan(inputs(BASE, [LVP_ICD], { apt: false }));
    assert.match(found[0].fix, /dnf install -y vulkan-loader/);
    assert.deepEqual(diagnoseVulkan(inputs([...BASE, 'libvulkan.so.1'], [LVP_ICD])), []);
  });
});
