'use strict';

// The reference's tests fork to sequence 1 on a context created with the default nSeqMax.
// llama.cpp itself only accepts ids below nSeqMax, so this package refuses with an error that
// names the option to raise; with nSeqMax raised, the same calls work. Prints one JSON object.

const { createContext, Branch } = require('llama-branch');
const modelPath = require('./_model');

async function main() {
  const small = await createContext({ modelPath, nCtx: 256 });
  const prompt = await small.tokenize('Hello');
  await small.decode(prompt, 0, 0);
  const root = Branch.create(small, 0, prompt.length, { temperature: 0 });
  root.captureLogits();
  let refused;
  try {
    root.fork(1);
  } catch (e) {
    refused = { code: e.code, message: e.message };
  }
  small.dispose();

  const roomy = await createContext({ modelPath, nCtx: 256, nSeqMax: 3 });
  await roomy.decode(prompt, 0, 0);
  const r = Branch.create(roomy, 0, prompt.length, { temperature: 0 });
  r.captureLogits();
  const forks = [r.fork(1), r.fork(2)].map((b) => b.seqId);
  roomy.dispose();
  console.log(JSON.stringify({ refused, forks }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
