#!/usr/bin/env node
'use strict';

/**
 * lib/native.d.ts, lib/'s typed contract with the addon: napi-derive records each `#[napi]` item's
 * signature while the crate compiles (in `typeDefFolder()`) and @napi-rs/cli's `generateTypeDef`,
 * what `napi build --dts` runs, renders them. The build stays ours: it is also the install script,
 * where devDependencies do not exist. `--check`: exit 1 if lib/native.d.ts is not current.
 */

const fs = require('node:fs');
const path = require('node:path');
const { repoRoot, typeDefFolder } = require('./env');

const OUTPUT = path.join(repoRoot, 'lib', 'native.d.ts');
const HEADER =
  '// Generated from the #[napi] items in src/napi/ by scripts/native-typings.js. Do not edit:\n' +
  '// change the Rust, run `npm run build`, then `node scripts/native-typings.js`.\n';
const GLOBAL_TYPES = new Set(['Array', 'Promise', 'Float32Array', 'Uint8Array', 'Buffer', 'Error', 'Record', 'Object']);

/** The declarations, importing from the public index.d.ts what they name but do not define (chat shapes). */
async function render() {
  // import(), not require(): the CLI's CommonJS build requires ESM-only packages, which only newer
  // Node versions can require().
  const { generateTypeDef } = await import('@napi-rs/cli');
  const { dts } = await generateTypeDef({ typeDefDir: typeDefFolder(), cwd: repoRoot, noDtsHeader: true });
  if (/\bArg</.test(dts)) throw new Error('a #[napi] parameter of type Arg<T> needs #[napi(ts_arg_type = "...")]');
  const code = dts.replace(/\/\*[\s\S]*?\*\/|\/\/.*/g, '');
  const defined = new Set(
    [...code.matchAll(/\b(?:class|interface|type|enum|function) ([A-Za-z0-9_]+)/g)].map((m) => m[1]),
  );
  const named = new Set(code.match(/\b[A-Z][A-Za-z0-9]*\b/g));
  const external = [...named].filter((n) => !defined.has(n) && !GLOBAL_TYPES.has(n)).sort();
  const imports = external.length ? `import type { ${external.join(', ')} } from '../index';\n` : '';
  return `${HEADER}${imports}\n${dts.trim()}\n`;
}

async function main() {
  if (!fs.existsSync(typeDefFolder()) || fs.readdirSync(typeDefFolder()).length === 0) {
    console.error(
      'native-typings: no recorded signatures; run `npm run build` first (it records them while compiling)',
    );
    process.exit(2);
  }
  const text = await render();
  if (!process.argv.includes('--check')) {
    fs.writeFileSync(OUTPUT, text);
    console.log(`wrote ${path.relative(repoRoot, OUTPUT)}`);
  } else if ((fs.existsSync(OUTPUT) ? fs.readFileSync(OUTPUT, 'utf8') : '') !== text) {
    console.error(
      'lib/native.d.ts does not match src/napi/: run `node scripts/native-typings.js` and commit the result',
    );
    process.exit(1);
  } else console.log('lib/native.d.ts matches the native signatures');
}

main().catch((e) => {
  console.error(`native-typings: ${e.message}`);
  process.exit(1);
});
