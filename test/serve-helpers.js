'use strict';

// `llama-branch serve` as a real child process on 127.0.0.1 (ephemeral port), for the tests that
// drive it with real clients.

const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { MODEL } = require('./helpers');

const BIN = path.join(__dirname, '..', 'bin', 'llama-branch.js');

/**
 * Starts the server (on `model`, the test model unless given); resolves `{ child, url }` once it
 * printed its `listening on` line.
 */
function startServer(args, env = process.env, model = MODEL) {
  const child = spawn(process.execPath, [BIN, 'serve', '--model', model, '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env,
  });
  let out = '';
  let err = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`no "listening on" line within 60 s; stdout: ${out} stderr: ${err}`)),
      60000,
    );
    child.stderr.on('data', (d) => {
      err += d;
    });
    child.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1], stderr: () => err });
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited with ${code} before listening; stderr: ${err}`));
    });
  });
}

/**
 * Runs `serve` with `args` expecting it to exit on its own (a refused flag or a failed start);
 * returns `{ status, stderr }`. A server that starts instead is killed after `ms`, and its status
 * is then null, which fails any test expecting an exit code.
 */
function serveUntilExit(args, ms = 60000) {
  const res = spawnSync(process.execPath, [BIN, 'serve', '--model', MODEL, '--port', '0', ...args], {
    encoding: 'utf8',
    timeout: ms,
  });
  return { status: res.status, stderr: res.stderr };
}

function stopServer(child) {
  return new Promise((resolve) => {
    // A child killed by a signal has no exit code but its signalCode: it is gone too.
    if (child.exitCode !== null || child.signalCode !== null) return resolve(child.exitCode ?? child.signalCode);
    const kill = setTimeout(() => child.kill('SIGKILL'), 10000);
    child.once('exit', (code, signal) => {
      clearTimeout(kill);
      resolve(code === null ? signal : code);
    });
    child.kill('SIGTERM');
  });
}

async function waitFor(check, what, ms = 10000) {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Reads GET /v1/events (server-sent events) with fetch until `until(events)` is true; resolves
 * with the events (JSON objects) read so far. `onOpen()` runs once the stream is open.
 */
async function readEvents(url, { key, until, onOpen = () => {}, ms = 60000 }) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error(`no matching events within ${ms} ms`)), ms);
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const res = await fetch(`${url}/v1/events`, { headers, signal: controller.signal });
  if (res.status !== 200) throw new Error(`GET /v1/events: HTTP ${res.status}`);
  const events = [];
  const decoder = new TextDecoder();
  let buffer = '';
  let opened = null;
  try {
    for await (const chunk of res.body) {
      buffer += decoder.decode(chunk, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) !== -1) {
        for (const line of buffer.slice(0, end).split('\n'))
          if (line.startsWith('data: ')) events.push(JSON.parse(line.slice(6)));
        buffer = buffer.slice(end + 2);
      }
      if (!opened) opened = Promise.resolve(onOpen());
      if (until(events)) break;
    }
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
  await opened;
  return events;
}

module.exports = {
  serveUntilExit,
  startServer,
  stopServer,
  waitFor,
  readEvents,
  BIN,
};
