'use strict';

/**
 * The Python of the Python-driven tests (decisions and systemone clients, the router, the KV event
 * consumer, the images' projector writer) and of the model download: which interpreter, and how
 * setup installs their packages.
 *
 * A Debian-style "externally managed" Python (PEP 668: an EXTERNALLY-MANAGED file in its stdlib
 * folder, outside a venv) refuses `pip install`. There setup makes a venv under the project's
 * cache, ~/.cache/llama-branch/python (python3-venv from apt when the venv module lacks pip), and
 * installs into it; every test then runs that venv's interpreter and tools. Elsewhere (pyenv, a
 * venv of the user's, Python from python.org) pip installs where it always did. LLAMA_BRANCH_PYTHON
 * names an interpreter to use instead of both.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const venvDir = path.join(os.homedir() || os.tmpdir(), '.cache', 'llama-branch', 'python');
const venvBin = (name) => path.join(venvDir, process.platform === 'win32' ? 'Scripts' : 'bin', name);

const runs = (python, args) => spawnSync(python, args, { stdio: 'ignore' }).status === 0;

/** The machine's Python (PYTHON, python3, python): the first that runs, or null. */
function systemPython() {
  return [process.env.PYTHON, 'python3', 'python'].filter(Boolean).find((py) => runs(py, ['--version'])) || null;
}

/** The interpreter the tests run: LLAMA_BRANCH_PYTHON, else setup's venv where it exists, else the machine's. */
function testPython() {
  if (process.env.LLAMA_BRANCH_PYTHON) return process.env.LLAMA_BRANCH_PYTHON;
  return fs.existsSync(venvBin('python')) ? venvBin('python') : systemPython();
}

/** A command a Python package installs (e.g. `sglang-router`): the venv's copy where it exists, else PATH's. */
function pythonTool(name) {
  if (process.env.LLAMA_BRANCH_PYTHON) {
    const beside = path.join(path.dirname(process.env.LLAMA_BRANCH_PYTHON), name);
    if (fs.existsSync(beside)) return beside;
  }
  return fs.existsSync(venvBin(name)) ? venvBin(name) : name;
}

/** Whether `python` refuses `pip install` (PEP 668), or has no pip at all: setup then uses the venv. */
function needsVenv(python) {
  const probe = [
    'import os, sys, sysconfig',
    'managed = sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))',
    'sys.exit(3 if managed else 0)',
  ].join('\n');
  return !runs(python, ['-c', probe]) || !runs(python, ['-m', 'pip', '--version']);
}

/**
 * The venv under the project's cache, made with `python` when missing; installs python3-venv with
 * `aptInstall` (scripts/env.js) when the venv module cannot bootstrap pip. Its interpreter, or
 * null with the reason logged.
 */
function ensureVenv(python, { log, aptInstall }) {
  if (runs(venvBin('python'), ['-m', 'pip', '--version'])) return venvBin('python');
  const make = () =>
    runs(python, ['-m', 'venv', '--clear', venvDir]) && runs(venvBin('python'), ['-m', 'pip', '--version']);
  if (!make()) {
    log(`${python} -m venv could not make a venv with pip; installing python3-venv`);
    if (!aptInstall(['python3-venv'], log) || !make()) {
      fs.rmSync(venvDir, { recursive: true, force: true });
      log(`no venv with pip at ${venvDir}: install python3-venv (apt) or set LLAMA_BRANCH_PYTHON to a Python with pip`);
      return null;
    }
  }
  log(`${python} is externally managed (PEP 668): the test packages go into the venv ${venvDir}`);
  return venvBin('python');
}

/**
 * The interpreter setup installs the test packages with: LLAMA_BRANCH_PYTHON, the machine's
 * Python where pip may install, else the venv (made now). Null, with the reason logged, when none.
 */
function installPython(env) {
  if (process.env.LLAMA_BRANCH_PYTHON) return process.env.LLAMA_BRANCH_PYTHON;
  if (fs.existsSync(venvBin('python'))) return ensureVenv(venvBin('python'), env);
  const python = systemPython();
  if (!python) {
    env.log('no python3 on PATH: the Python-driven tests cannot run (apt-get install python3 python3-venv)');
    return null;
  }
  return needsVenv(python) ? ensureVenv(python, env) : python;
}

/** llama.cpp's own server as a Python module: the independent reference of `npm run test:models` and `bench:peers`. */
const XLLAMACPP = 'xllamacpp==2026.10.11549';
const xllamacppDir = path.join(os.homedir() || os.tmpdir(), '.cache', 'llama-branch', 'xllamacpp');

/**
 * The interpreter and environment that import the pinned `xllamacpp`, installing it on first use
 * with `pip install --target` into ~/.cache/llama-branch/xllamacpp (no dependencies: it needs
 * none, and the test venv stays as setup made it). Throws with pip's output when it cannot.
 */
function xllamacpp() {
  const python = testPython() || 'python3';
  if (!fs.existsSync(path.join(xllamacppDir, 'xllamacpp'))) {
    const args = [
      '-m',
      'pip',
      'install',
      '--quiet',
      '--disable-pip-version-check',
      '--no-deps',
      '--target',
      xllamacppDir,
    ];
    const r = spawnSync(python, [...args, XLLAMACPP], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    if (r.status !== 0)
      throw new Error(`pip could not install ${XLLAMACPP} (llama.cpp's server, the reference): ${r.stderr}`);
  }
  return { python, env: { ...process.env, PYTHONPATH: xllamacppDir }, version: XLLAMACPP.split('==')[1] };
}

module.exports = { venvDir, systemPython, testPython, pythonTool, needsVenv, installPython, xllamacpp };
