'use strict';

/**
 * The one way this repository installs its own tarballs into a scratch project (the package test,
 * the prebuilt install test, the GPU tier, bench/vulkan.js): `npm install TARBALLS` against an
 * empty npm cache and npm configuration of the install's own, with the registry a loopback one
 * (./registry.js) that serves only the runtime dependency closure packed from this repository's
 * node_modules, every version of it: dependencies of dependencies, nested copies included.
 *
 * Why: npm resolves a range (`@msgpack/msgpack@^3.1.3`) from the registry's full metadata
 * document, which `npm ci` never stores, so an offline install read from `~/.npm` passed only on
 * machines where the dependency was once added by hand, and failed on a fresh one (issue 59).
 * With a scratch cache and HOME, no warm cache of the machine can hide a missing step; with a
 * registry (not tarballs on the command line, which all land at the top of node_modules), a
 * closure holding two versions of one name installs as npm would place it.
 */

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { repoRoot, npmCli } = require('../../scripts/env');
const { startRegistry } = require('./registry');

const readJson = (file) => JSON.parse(fs.readFileSync(file, 'utf8'));

/** The folder Node would load `name` from when required by the package in `fromDir`, or null. */
function resolvePackageDir(name, fromDir, top) {
  for (let dir = fromDir; ; dir = path.dirname(dir)) {
    if (path.basename(dir) !== 'node_modules') {
      const candidate = path.join(dir, 'node_modules', name);
      if (fs.existsSync(path.join(candidate, 'package.json'))) return candidate;
    }
    if (dir === top || dir === path.dirname(dir)) return null;
  }
}

/** What a package needs installed beside it: dependencies, peers npm installs, optional ones present. */
function runtimeNeeds(pkg) {
  const peersOptional = pkg.peerDependenciesMeta || {};
  return [
    ...Object.keys(pkg.dependencies || {}).map((name) => ({ name, optional: false })),
    ...Object.keys(pkg.peerDependencies || {}).map((name) => ({ name, optional: !!peersOptional[name]?.optional })),
    ...Object.keys(pkg.optionalDependencies || {}).map((name) => ({ name, optional: true })),
  ];
}

/**
 * The runtime dependency closure of the package in `root` (default: this repository) as installed
 * in its node_modules: `[{ name, version, dir }]`, each name and version once, the root excluded.
 * Throws when a required dependency is not installed (run `npm ci`).
 */
function dependencyClosure(root = repoRoot) {
  const found = new Map(); // real folder -> { name, version, dir }
  const seen = new Set(); // name@version
  const pending = [root];
  while (pending.length > 0) {
    const dir = pending.pop();
    for (const need of runtimeNeeds(readJson(path.join(dir, 'package.json')))) {
      const depDir = resolvePackageDir(need.name, dir, root);
      if (!depDir) {
        if (need.optional) continue;
        throw new Error(`${need.name}, a runtime dependency of ${dir}, is not installed: run \`npm ci\` first`);
      }
      const real = fs.realpathSync(depDir);
      const version = readJson(path.join(depDir, 'package.json')).version;
      if (found.has(real) || seen.has(`${need.name}@${version}`)) continue;
      found.set(real, { name: need.name, version, dir: depDir });
      seen.add(`${need.name}@${version}`);
      pending.push(depDir);
    }
  }
  const key = (d) => `${d.name}@${d.version}`;
  return [...found.values()].sort((a, b) => key(a).localeCompare(key(b), undefined, { numeric: true }));
}

/**
 * Packs every package of the dependency closure into `dir` (no lifecycle scripts):
 * `[{ name, version, file, manifest }]`, what ./registry.js serves.
 */
function dependencyTarballs(dir, root = repoRoot) {
  return dependencyClosure(root).map((dep) => {
    const packed = spawnSync(
      process.execPath,
      [npmCliOrThrow(), 'pack', '--ignore-scripts', '--json', '--pack-destination', dir, dep.dir],
      { encoding: 'utf8', env: scratchNpmEnv(dir, process.env) },
    );
    if (packed.status !== 0) throw new Error(`npm pack of ${dep.name} failed:\n${packed.stdout}\n${packed.stderr}`);
    const manifest = readJson(path.join(dep.dir, 'package.json'));
    return {
      name: dep.name,
      version: dep.version,
      file: path.join(dir, JSON.parse(packed.stdout)[0].filename),
      manifest,
    };
  });
}

function npmCliOrThrow() {
  const cli = npmCli();
  if (!cli) throw new Error('cannot find npm-cli.js (run this through npm, or put npm on PATH)');
  return cli;
}

/**
 * `base` with npm confined to `dir`: an empty cache (`npm-cache`), empty user and global
 * configuration files, the registry on a closed loopback port, HOME a scratch folder (so that
 * `~/.npm` and `~/.npmrc` are out of reach). Cargo, rustup and ccache keep their real folders
 * when `base` had them (the package test builds from source with the machine's toolchain).
 */
function scratchNpmEnv(dir, base) {
  const home = path.join(dir, 'home');
  const [userrc, globalrc] = ['npmrc-user', 'npmrc-global'].map((f) => path.join(dir, f));
  fs.mkdirSync(home, { recursive: true });
  for (const rc of [userrc, globalrc]) if (!fs.existsSync(rc)) fs.writeFileSync(rc, '');
  const env = {};
  for (const [k, v] of Object.entries(base)) if (!/^npm_config_/i.test(k)) env[k] = v;
  // Real folders of the machine's toolchain, kept for a source build (none exists in a scratch HOME).
  const kept = (name, ...sub) => {
    const folder = base.HOME && path.join(base.HOME, ...sub);
    return !base[name] && folder && fs.existsSync(folder) ? { [name]: folder } : {};
  };
  return {
    ...env,
    ...kept('CARGO_HOME', '.cargo'),
    ...kept('RUSTUP_HOME', '.rustup'),
    ...kept('CCACHE_DIR', '.cache', 'ccache'),
    HOME: home,
    npm_config_cache: path.join(dir, 'npm-cache'),
    npm_config_userconfig: userrc,
    npm_config_globalconfig: globalrc,
    npm_config_registry: 'http://127.0.0.1:9/',
    npm_config_update_notifier: 'false',
    npm_config_audit: 'false',
    npm_config_fund: 'false',
  };
}

/**
 * Installs `tarballs` (paths) into a new scratch project `dir/project` with scratch npm state,
 * their dependencies from a loopback registry of the dependency closure (./registry.js). `env`: the base environment (default: this process's);
 * `npm`: `[command, leading args]` (default: this node with npm-cli.js); `foregroundScripts`:
 * show the install scripts' output; `root`: the package whose node_modules the dependencies come
 * from (default: this repository). Returns `{ project, status, output, ms }`.
 */
function scratchInstall({ dir, tarballs, env = process.env, npm = null, foregroundScripts = false, root = repoRoot }) {
  const project = path.join(dir, 'project');
  fs.mkdirSync(project, { recursive: true });
  fs.writeFileSync(
    path.join(project, 'package.json'),
    `${JSON.stringify({ name: 'scratch', version: '1.0.0', private: true }, null, 2)}\n`,
  );
  const [cmd, pre] = npm || [process.execPath, [npmCliOrThrow()]];
  const args = ['install', '--no-audit', '--no-fund', ...(foregroundScripts ? ['--foreground-scripts'] : [])];
  const registry = startRegistry(dir, dependencyTarballs(dir, root));
  const started = Date.now(); // the install alone: the prebuilt test bounds it
  let res;
  try {
    res = spawnSync(cmd, [...pre, ...args, ...tarballs], {
      cwd: project,
      env: { ...scratchNpmEnv(dir, env), npm_config_registry: registry.url },
      encoding: 'utf8',
      maxBuffer: 64 * 2 ** 20,
    });
  } finally {
    registry.stop();
  }
  const output = `${res.stdout || ''}\n${res.stderr || ''}${res.error ? `\n${res.error.message}` : ''}`;
  return { project, status: res.status ?? 1, output, ms: Date.now() - started };
}

module.exports = { dependencyClosure, dependencyTarballs, scratchNpmEnv, scratchInstall };
