'use strict';

/**
 * `llama-branch rpc-server`: llama.cpp's RPC server on this machine's devices (its GPUs, else the
 * CPU), until SIGINT/SIGTERM. Clients use it with `createContext({ rpcServers: ['host:port'] })`.
 * The protocol has no authentication: binding anything but loopback needs --allow-remote.
 */

const options = {
  port: { type: 'string', short: 'p', default: '50052', help: 'TCP port' },
  host: { type: 'string', default: '127.0.0.1', help: 'address to bind (non-loopback needs --allow-remote)' },
  threads: { type: 'string', short: 't', help: "CPU threads for the server's computations (default: all cores)" },
  'cache-dir': {
    type: 'string',
    help: 'folder where the server caches tensors it received (by hash), so clients reload faster',
  },
  'allow-remote': {
    type: 'boolean',
    help: 'allow a non-loopback --host (the protocol has NO authentication: trusted networks only)',
  },
};

class UsageError extends Error {}

function integer(values, name, min, max) {
  const raw = values[name];
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new UsageError(`--${name} must be an integer in [${min}, ${max}], got ${raw}`);
  return n;
}

async function run(values, { log }) {
  const { serveRpc } = require('../index');
  const port = integer(values, 'port', 1, 65535);
  const threads = integer(values, 'threads', 1, 1024);
  let info;
  try {
    info = serveRpc({
      host: values.host,
      port,
      threads,
      cacheDir: values['cache-dir'],
      allowRemote: values['allow-remote'] === true,
    });
  } catch (e) {
    if (e.code === 'ERR_INVALID_ARG') throw Object.assign(new UsageError(e.message), { code: e.code });
    throw e;
  }
  log(`rpc-server listening on ${info.endpoint} (devices: ${info.devices.join(', ')})`);
  // The server runs on a native thread, which does not keep the event loop alive.
  const keepAlive = setInterval(() => {}, 1 << 30);
  await new Promise((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  clearInterval(keepAlive);
  // The native server thread cannot be stopped; leave through exit.
  process.exit(0);
}

module.exports = {
  summary: "llama.cpp RPC server: lend this machine's devices to createContext({ rpcServers })",
  usage: 'llama-branch rpc-server [--port 50052] [--host 127.0.0.1] [--threads N] [--cache-dir DIR] [--allow-remote]',
  options,
  run,
  UsageError,
};
