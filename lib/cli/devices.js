'use strict';

/**
 * `llama-branch devices`: what this machine offers llama-branch — the build that loaded, its
 * CPU backend variant, every device, each GPU backend module package and why one is off (with
 * the missing system library and its fix, lib/gpu-diagnosis.js), and
 * where `createContext({ gpu: 'auto' })` would put a model's layers (like node-llama-cpp's
 * `inspect gpu`).
 */

const options = {
  json: { type: 'boolean', help: 'print one JSON object instead of text' },
};

async function run(values, { log }) {
  const { systemInfo, listDevices, gpuModules } = require('../index');
  const info = systemInfo();
  const devices = listDevices();
  const modules = gpuModules();
  const gpus = devices.filter((d) => d.type === 'gpu');
  const auto = gpus.length > 0 ? `every layer on ${gpus.map((d) => d.name).join(', ')}` : 'the CPU';
  const variant = /CPU_VARIANT = ([^ |]+)/.exec(info);
  if (values.json) {
    log(JSON.stringify({ systemInfo: info, devices, gpuModules: modules, auto: gpus.map((d) => d.name) }, null, 2));
    return;
  }
  const gib = (bytes) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  log(`CPU backend: ${variant ? `prebuilt, variant ${variant[1]}` : 'compiled in (source build)'}`);
  log('devices:');
  for (const d of devices)
    log(
      `  ${d.name.padEnd(10)} ${d.type.padEnd(4)} ${gib(d.memoryFree)} free of ${gib(d.memoryTotal)}  ${d.description}`,
    );
  if (modules.length > 0) {
    log('GPU backend modules:');
    for (const m of modules) {
      const state = m.loaded && m.devices > 0 ? `loaded, ${m.devices} device(s)` : `off: ${m.error}`;
      log(`  ${m.variant.padEnd(8)} ${m.package}  ${state}`);
      for (const f of m.diagnosis) {
        log(`    missing: ${f.missing} (${f.why})`);
        log(`    fix:     ${f.fix}`);
      }
    }
  }
  log(`createContext({ gpu: 'auto' }) puts ${auto}.`);
}

module.exports = {
  summary: 'the devices llama-branch sees, its GPU backend modules and why one is off',
  usage: 'llama-branch devices [--json]',
  options,
  run,
};
