'use strict';

// test/install/scratch.js, the one scratch install of the package, pack and GPU tests (issue 59):
// the runtime dependency closure as Node resolves it, every version of it, and an install with an
// empty npm cache from a loopback registry of that closure (an offline install from an empty
// cache fails, as on a fresh machine, without it).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { npmCli, repoRoot } = require('../../scripts/env');
const { dependencyClosure, scratchInstall, scratchNpmEnv } = require('../../test/install/scratch');

/** Writes a package (package.json and an index.js requiring its dependencies) into `dir`. */
function writePackage(dir, pkg) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ version: '1.0.0', main: 'index.js', ...pkg }));
  const requires = Object.keys(pkg.dependencies || {}).map((d) => `require(${JSON.stringify(d)});`);
  fs.writeFileSync(
    path.join(dir, 'index.js'),
    `${requires.join('\n')}\nmodule.exports = ${JSON.stringify(pkg.name)};\n`,
  );
}

describe('test/install/scratch.js', function () {
  this.timeout(120000);
  let tmp;
  beforeEach(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'scratch-install-unit-'));
  });
  afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /** top -> mid -> leaf (hoisted), top -> opt (optional, absent), top -> peer (optional peer, absent). */
  function tree() {
    const root = path.join(tmp, 'top');
    writePackage(root, {
      name: 'top',
      dependencies: { mid: '^1.0.0' },
      optionalDependencies: { opt: '^1.0.0' },
      peerDependencies: { peer: '^1.0.0' },
      peerDependenciesMeta: { peer: { optional: true } },
    });
    writePackage(path.join(root, 'node_modules', 'mid'), { name: 'mid', dependencies: { leaf: '^1.0.0' } });
    writePackage(path.join(root, 'node_modules', 'leaf'), { name: 'leaf', version: '1.2.0' });
    return root;
  }

  it('dependencyClosure: dependencies of dependencies, hoisted or nested; absent optional ones skipped', () => {
    const root = tree();
    assert.deepEqual(
      dependencyClosure(root).map((d) => `${d.name}@${d.version}`),
      ['leaf@1.2.0', 'mid@1.0.0'],
    );
    // mid's own nested copy of leaf wins over the hoisted one, as Node resolves it.
    writePackage(path.join(root, 'node_modules', 'mid', 'node_modules', 'leaf'), { name: 'leaf', version: '1.3.0' });
    fs.rmSync(path.join(root, 'node_modules', 'leaf'), { recursive: true });
    assert.deepEqual(
      dependencyClosure(root).map((d) => `${d.name}@${d.version}`),
      ['leaf@1.3.0', 'mid@1.0.0'],
    );
  });

  /** tree() plus `other`, which keeps its own leaf 2.0.0 nested beside the hoisted leaf 1.0.0. */
  function treeWithTwoLeaves() {
    const root = tree();
    fs.rmSync(path.join(root, 'node_modules', 'leaf'), { recursive: true });
    writePackage(path.join(root, 'node_modules', 'leaf'), { name: 'leaf' });
    writePackage(path.join(root, 'node_modules', 'other'), { name: 'other', dependencies: { leaf: '^2.0.0' } });
    writePackage(path.join(root, 'node_modules', 'other', 'node_modules', 'leaf'), { name: 'leaf', version: '2.0.0' });
    const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
    pkg.dependencies.other = '^1.0.0';
    fs.writeFileSync(path.join(root, 'package.json'), JSON.stringify(pkg));
    return root;
  }

  it('dependencyClosure: a missing required dependency says why; two versions of one name are both kept', () => {
    const root = tree();
    fs.rmSync(path.join(root, 'node_modules', 'leaf'), { recursive: true });
    assert.throws(() => dependencyClosure(root), /leaf, a runtime dependency of .*mid, is not installed: run `npm ci`/);
    assert.deepEqual(
      dependencyClosure(treeWithTwoLeaves()).map((d) => `${d.name}@${d.version}`),
      ['leaf@1.0.0', 'leaf@2.0.0', 'mid@1.0.0', 'other@1.0.0'],
    );
  });

  it('scratchInstall: two versions of one name install where npm places them (the loopback registry)', () => {
    const root = treeWithTwoLeaves();
    fs.writeFileSync(
      path.join(root, 'index.js'),
      "module.exports = [require('mid'), require('other/node_modules/leaf/package.json').version].join();\n",
    );
    const packed = spawnSync(process.execPath, [npmCli(), 'pack', '--json', '--pack-destination', tmp, root], {
      encoding: 'utf8',
      env: scratchNpmEnv(path.join(tmp, 'pack'), process.env),
    });
    assert.equal(packed.status, 0, packed.stderr);
    const tarball = path.join(tmp, JSON.parse(packed.stdout)[0].filename);
    const installed = scratchInstall({ dir: path.join(tmp, 'scratch'), tarballs: [tarball], root });
    assert.equal(installed.status, 0, installed.output);
    const modules = path.join(installed.project, 'node_modules');
    const versionOf = (...p) => JSON.parse(fs.readFileSync(path.join(modules, ...p, 'package.json'), 'utf8')).version;
    assert.equal(versionOf('leaf'), '1.0.0');
    assert.equal(versionOf('other', 'node_modules', 'leaf'), '2.0.0');
    const loaded = spawnSync(process.execPath, ['-p', "require('top')"], { cwd: installed.project, encoding: 'utf8' });
    assert.equal(loaded.stdout.trim(), 'mid,2.0.0', loaded.stderr);
  });

  it("scratchNpmEnv: npm's cache and configuration are the scratch folder's, HOME's out of reach", () => {
    const env = scratchNpmEnv(path.join(tmp, 'npm'), { ...process.env, npm_config_cache: '/somewhere/else' });
    const get = (key) =>
      spawnSync(process.execPath, [npmCli(), 'config', 'get', key], { env, encoding: 'utf8' }).stdout.trim();
    assert.equal(get('cache'), path.join(tmp, 'npm', 'npm-cache'));
    assert.equal(get('userconfig'), path.join(tmp, 'npm', 'npmrc-user'));
    assert.equal(get('registry'), 'http://127.0.0.1:9/');
    assert.equal(env.HOME, path.join(tmp, 'npm', 'home'));
  });

  it('this repository: the closure holds the runtime dependencies of --kv-events and --grpc-port', () => {
    const names = dependencyClosure(repoRoot).map((d) => d.name);
    for (const name of ['@msgpack/msgpack', '@grpc/grpc-js', 'protobufjs']) assert.ok(names.includes(name), name);
  });

  it('an offline install with an empty cache fails without the closure and works with it', () => {
    const root = tree();
    const packed = spawnSync(process.execPath, [npmCli(), 'pack', '--json', '--pack-destination', tmp, root], {
      encoding: 'utf8',
      env: scratchNpmEnv(path.join(tmp, 'pack'), process.env),
    });
    assert.equal(packed.status, 0, packed.stderr);
    const tarball = path.join(tmp, JSON.parse(packed.stdout)[0].filename);

    // The fresh-machine failure: the range ^1.0.0 cannot be resolved from an empty cache.
    const bare = path.join(tmp, 'bare');
    fs.mkdirSync(bare);
    fs.writeFileSync(path.join(bare, 'package.json'), '{ "name": "bare", "version": "1.0.0", "private": true }');
    const failed = spawnSync(process.execPath, [npmCli(), 'install', '--offline', tarball], {
      cwd: bare,
      encoding: 'utf8',
      env: scratchNpmEnv(path.join(tmp, 'bare-npm'), process.env),
    });
    assert.notEqual(failed.status, 0, 'an offline install from an empty cache must not find mid');
    assert.match(failed.stderr, /ENOTCACHED|only-if-cached/);

    const installed = scratchInstall({ dir: path.join(tmp, 'scratch'), tarballs: [tarball], root });
    assert.equal(installed.status, 0, installed.output);
    const loaded = spawnSync(process.execPath, ['-p', "require('top')"], { cwd: installed.project, encoding: 'utf8' });
    assert.equal(loaded.stdout.trim(), 'top', loaded.stderr);
    assert.ok(fs.existsSync(path.join(installed.project, 'node_modules', 'leaf', 'package.json')), 'leaf installed');
    assert.ok(fs.readdirSync(path.join(tmp, 'scratch', 'npm-cache')).length > 0, 'the scratch cache was used');
  });
});
