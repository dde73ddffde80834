'use strict';

/**
 * A package registry on loopback for scratch installs (./scratch.js): serves the tarballs packed
 * from this repository's node_modules, each name's packument listing every version packed. Why a
 * registry and not tarballs on the command line: a command-line install puts every tarball at the
 * top of node_modules, so it cannot place two versions of one name (yargs, under
 * @grpc/proto-loader, keeps its own ansi-regex 5 beside the 6 others use), and npm resolves each
 * range against a registry's full metadata, which no offline cache of the machine is trusted to
 * hold (issue 59). Nothing outside the machine is reached: the registry knows only the packed files.
 *
 * Run as a child process (`node registry.js INDEX PORTFILE`) so that the parent can block in
 * `spawnSync(npm install)` while the registry answers; `startRegistry` does that and waits for
 * the port. INDEX is JSON: `[{ name, version, file, manifest }]`.
 */

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { createHash } = require('node:crypto');
const { spawn } = require('node:child_process');

/** The packument of `name` (every version in `entries`), tarball URLs under `base`. */
function packument(name, entries, base) {
  const versions = {};
  for (const e of entries.filter((x) => x.name === name)) {
    const bytes = fs.readFileSync(e.file);
    versions[e.version] = {
      ...e.manifest,
      _id: `${name}@${e.version}`,
      dist: {
        tarball: `${base}/-/${encodeURIComponent(path.basename(e.file))}`,
        integrity: `sha512-${createHash('sha512').update(bytes).digest('base64')}`,
        shasum: createHash('sha1').update(bytes).digest('hex'),
      },
    };
  }
  const names = Object.keys(versions);
  if (names.length === 0) return null;
  const latest = names.sort((a, b) => a.localeCompare(b, undefined, { numeric: true })).at(-1);
  return { name, 'dist-tags': { latest }, versions };
}

function serve(indexFile, portFile) {
  const entries = JSON.parse(fs.readFileSync(indexFile, 'utf8'));
  const files = new Map(entries.map((e) => [path.basename(e.file), e.file]));
  const server = http.createServer((req, res) => {
    const base = `http://${req.headers.host}`;
    const url = decodeURIComponent(new URL(req.url, base).pathname);
    const file = url.startsWith('/-/') ? files.get(url.slice(3)) : null;
    if (file) {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      return fs.createReadStream(file).pipe(res);
    }
    const doc = url.startsWith('/-/') ? null : packument(url.slice(1), entries, base);
    res.writeHead(doc ? 200 : 404, { 'content-type': 'application/json' });
    res.end(JSON.stringify(doc || { error: 'not_found' }));
  });
  server.listen(0, '127.0.0.1', () => {
    fs.writeFileSync(`${portFile}.tmp`, String(server.address().port));
    fs.renameSync(`${portFile}.tmp`, portFile); // whole, or not there yet
  });
}

/**
 * Starts the registry over `entries` (written to `dir`/registry.json) in a child process; returns
 * `{ url, stop }` once it listens. Synchronous (polls for the port), for synchronous callers.
 */
function startRegistry(dir, entries) {
  const indexFile = path.join(dir, 'registry.json');
  const portFile = path.join(dir, 'registry.port');
  fs.writeFileSync(indexFile, JSON.stringify(entries));
  fs.rmSync(portFile, { force: true });
  const child = spawn(process.execPath, [__filename, indexFile, portFile], { stdio: ['ignore', 'ignore', 'inherit'] });
  const sleep = new Int32Array(new SharedArrayBuffer(4));
  for (let waited = 0; !fs.existsSync(portFile); waited += 20) {
    if (waited > 15000 || child.exitCode !== null) {
      child.kill();
      throw new Error('the scratch registry did not start listening');
    }
    Atomics.wait(sleep, 0, 0, 20);
  }
  const port = Number(fs.readFileSync(portFile, 'utf8'));
  return { url: `http://127.0.0.1:${port}/`, stop: () => child.kill() };
}

if (require.main === module) serve(process.argv[2], process.argv[3]);

module.exports = { startRegistry, packument };
