'use strict';

// Device listing and placement options, on this machine's devices (no GPU needed): every bad
// option is a coded error before anything loads. The RPC servers themselves are in rpc.test.js.

const assert = require('node:assert/strict');
const net = require('node:net');
const { listDevices, serveRpc } = require('..');
const { open, rejects, throwsSync } = require('./helpers');

/** A loopback port nothing listens on (bound, then closed). */
function closedPort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

describe('devices and placement options', function () {
  this.timeout(120000);

  it('listDevices() lists the CPU with its memory', () => {
    const devices = listDevices();
    assert.ok(devices.length >= 1);
    const cpu = devices.find((d) => d.type === 'cpu');
    assert.ok(cpu, JSON.stringify(devices));
    assert.equal(typeof cpu.name, 'string');
    assert.ok(cpu.memoryTotal > 0 && cpu.memoryFree > 0 && cpu.memoryFree <= cpu.memoryTotal);
    for (const d of devices) assert.ok(['cpu', 'gpu', 'rpc'].includes(d.type));
  });

  it('a context reports where its layers went', async () => {
    const ctx = await open();
    try {
      const { layers, totalLayers, devices } = ctx.offload;
      assert.ok(totalLayers > 1);
      const gpus = listDevices().filter((d) => d.type === 'gpu');
      if (gpus.length === 0) {
        assert.equal(layers, 0);
        assert.deepEqual(devices, []);
      } else {
        assert.equal(layers, totalLayers);
      }
      assert.equal(ctx.lost, false);
    } finally {
      ctx.dispose();
    }
  });

  it("gpu: false (devices: []) keeps the CPU alone; gpu: 'vulkan' without a Vulkan device says why", async () => {
    const ctx = await open({ gpu: false });
    try {
      assert.deepEqual(ctx.offload.devices, []);
      assert.equal(ctx.offload.layers, 0);
    } finally {
      ctx.dispose();
    }
    const same = await open({ devices: [] });
    assert.deepEqual(same.offload.devices, []);
    same.dispose();
    await rejects(() => open({ gpu: false, devices: ['Vulkan0'] }), 'ERR_INVALID_ARG', /gpu is false/);
    await rejects(() => open({ gpu: 'cuda' }), 'ERR_INVALID_ARG', /'auto', 'vulkan', 'cpu' or false/);
    if (!listDevices().some((d) => /^Vulkan/.test(d.name))) {
      await rejects(
        () => open({ gpu: 'vulkan' }),
        'ERR_DEVICE',
        /no Vulkan device.*(llama-branch-linux-x64-gnu-vulkan|LLAMA_BRANCH_FEATURES=vulkan)/s,
      );
    }
  });

  it('bad placement options are coded errors', async () => {
    await rejects(() => open({ devices: ['NoSuchDevice0'] }), 'ERR_DEVICE', /unknown device/);
    await rejects(() => open({ devices: ['CPU'] }), 'ERR_DEVICE', /CPU/);
    await rejects(() => open({ nGpuLayers: 100000 }), 'ERR_DEVICE', /nGpuLayers/);
    await rejects(() => open({ nGpuLayers: -1 }), 'ERR_INVALID_ARG');
    await rejects(() => open({ nGpuLayers: 1.5 }), 'ERR_INVALID_ARG');
    await rejects(() => open({ splitMode: 'diagonal' }), 'ERR_INVALID_ARG', /splitMode/);
    await rejects(
      () => open({ tensorSplit: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] }),
      'ERR_DEVICE',
      /tensorSplit/,
    );
    await rejects(() => open({ tensorSplit: [-1] }), 'ERR_DEVICE', /tensorSplit/);
    await rejects(() => open({ tensorSplit: ['a'] }), 'ERR_INVALID_ARG');
    await rejects(() => open({ mainGpu: 7 }), 'ERR_DEVICE', /mainGpu/);
    await rejects(() => open({ rpcServers: 'localhost:1' }), 'ERR_INVALID_ARG');
  });

  it('malformed and unreachable RPC endpoints are coded errors, not aborts', async () => {
    for (const bad of ['localhost', '127.0.0.1:', '127.0.0.1:0', '127.0.0.1:70000', '::1:50052', 'a b:1', ':50052']) {
      await rejects(() => open({ rpcServers: [bad] }), 'ERR_INVALID_ARG', /host:port/);
      throwsSync(() => listDevices({ rpcServers: [bad] }), 'ERR_INVALID_ARG');
    }
    const port = await closedPort();
    const started = Date.now();
    await rejects(
      () => open({ rpcServers: [`127.0.0.1:${port}`] }),
      'ERR_RPC_UNREACHABLE',
      new RegExp(`127.0.0.1:${port}`),
    );
    throwsSync(() => listDevices({ rpcServers: [`127.0.0.1:${port}`] }), 'ERR_RPC_UNREACHABLE');
    assert.ok(Date.now() - started < 10000, 'the probe has a timeout');
    await rejects(() => open({ rpcServers: ['127.0.0.1:1', '127.0.0.1:1'] }), 'ERR_INVALID_ARG', /twice/);
  });

  it('serveRpc refuses non-loopback hosts without allowRemote, and busy ports', async () => {
    const e = throwsSync(() => serveRpc({ host: '0.0.0.0', port: 50999 }), 'ERR_INVALID_ARG');
    assert.match(e.message, /authentication/);
    throwsSync(() => serveRpc({ port: 0 }), 'ERR_INVALID_ARG');
    throwsSync(() => serveRpc({ port: '50052' }), 'ERR_INVALID_ARG');
    const server = net.createServer();
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      throwsSync(() => serveRpc({ port: server.address().port }), 'ERR_INVALID_ARG');
    } finally {
      server.close();
    }
  });
});
