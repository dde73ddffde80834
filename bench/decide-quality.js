#!/usr/bin/env node
'use strict';

/**
 * Typed decisions (issue 41): order sensitivity, accuracy and calibration on a small labelled
 * set written for this bench (not tuned to any model): 16 review sentiments (3 options), 16
 * news-headline topics (4 options) and 16 yes/no facts. Each choice question is asked with its
 * options in their listed order and reversed, with `permute: 1` (no averaging) and with
 * `permute: 2` (two cyclic shifts of the labels, averaged) and `permute: n` (every shift).
 * Reported per setting:
 *   mean |Δp|   the mean, over questions and options, of |p(order A) − p(order B)|
 *   accuracy    the most likely option is the label (a noul: p(yes) > 0.5 is the answer)
 *   ECE         expected calibration error over 10 equal-width confidence bins (confidence =
 *               the winner's probability)
 *
 * Usage: node bench/decide-quality.js [--threads=2] [--template=chat|raw]
 */

const os = require('node:os');
const { createContext, Scheduler } = require('..');
const { args, modelPath } = require('./common');

const SENTIMENT = [
  ['The food was excellent and the staff were friendly.', 'positive'],
  ['Terrible service; we waited an hour and the soup was cold.', 'negative'],
  ['The museum opens at nine and closes at five.', 'neutral'],
  ['I loved every minute of this film.', 'positive'],
  ['The charger broke after two days. Do not buy it.', 'negative'],
  ['The package contains two cables and a manual.', 'neutral'],
  ['Best holiday we have ever had, the beach was perfect.', 'positive'],
  ['The hotel room was dirty and smelled of smoke.', 'negative'],
  ['The train leaves from platform four.', 'neutral'],
  ['Wonderful book, I could not put it down.', 'positive'],
  ['The app crashes every time I open it.', 'negative'],
  ['The meeting is scheduled for Tuesday.', 'neutral'],
  ['Great value and fast delivery, very happy.', 'positive'],
  ['Rude staff and overpriced drinks.', 'negative'],
  ['The report has twelve pages.', 'neutral'],
  ['An amazing concert, the band was fantastic.', 'positive'],
];

const TOPIC = [
  ['Local team wins the football cup after a late penalty.', 'sports'],
  ['Parliament passes the new budget after a long debate.', 'politics'],
  ['Astronomers find water vapour on a distant planet.', 'science'],
  ['How to bake a soft loaf of bread at home.', 'cooking'],
  ['Tennis star reaches the final without dropping a set.', 'sports'],
  ['The president meets foreign ministers to discuss trade.', 'politics'],
  ['New vaccine trial shows strong immune response.', 'science'],
  ['Five quick pasta sauces for busy evenings.', 'cooking'],
  ['Marathon runner sets a new national record.', 'sports'],
  ['Election results delayed as votes are recounted.', 'politics'],
  ['Physicists measure the mass of the neutrino more precisely.', 'science'],
  ['A simple recipe for roast chicken with lemon.', 'cooking'],
  ['Cycling team crashes in the final stage of the race.', 'sports'],
  ['The senate rejects the proposed tax reform.', 'politics'],
  ['Biologists discover a new species of frog in the rainforest.', 'science'],
  ['The secret to crispy roast potatoes.', 'cooking'],
];

const FACTS = [
  ['Paris is the capital of France.', true],
  ['The sun rises in the west.', false],
  ['Water freezes at zero degrees Celsius.', true],
  ['A week has ten days.', false],
  ['Cats are mammals.', true],
  ['The moon is larger than the earth.', false],
  ['Two plus two is four.', true],
  ['Fish breathe air through lungs.', false],
  ['Snow is cold.', true],
  ['Berlin is in Spain.', false],
  ['Birds have feathers.', true],
  ['Ice is hotter than boiling water.', false],
  ['A triangle has three sides.', true],
  ['The Pacific is a desert.', false],
  ['Humans need oxygen to live.', true],
  ['Gold is a kind of vegetable.', false],
];

const SENTIMENTS = ['positive', 'negative', 'neutral'];
const TOPICS = ['sports', 'politics', 'science', 'cooking'];

/** A choice question over `options` in that order. */
function choice(instructions, options) {
  return { type: 'choice', instructions, criteria: Object.fromEntries(options.map((o) => [o, null])) };
}

/** Asks every item once with `options` in the given order; returns each answer's probabilities. */
async function askAll(scheduler, items, question, options, permute, template) {
  return Promise.all(
    items.map(async ([text]) => {
      const { answers } = await scheduler.decide({
        state: text,
        questions: { q: question(options) },
        permute,
        template,
      });
      return answers.q;
    }),
  );
}

/** Expected calibration error: |accuracy − confidence| per confidence bin, weighted by the bin's size. */
function ece(confidences, correct, bins = 10) {
  let total = 0;
  for (let b = 0; b < bins; b++) {
    const inBin = confidences
      .map((c, i) => [c, correct[i]])
      .filter(([c]) => (c > b / bins || (b === 0 && c === 0)) && c <= (b + 1) / bins);
    if (inBin.length === 0) continue;
    const acc = inBin.filter(([, ok]) => ok).length / inBin.length;
    const conf = inBin.reduce((s, [c]) => s + c, 0) / inBin.length;
    total += (inBin.length / confidences.length) * Math.abs(acc - conf);
  }
  return total;
}

/** Order sensitivity, accuracy and ECE of a choice set with `permute`. */
async function choiceSet(scheduler, items, instructions, options, permute, template) {
  const q = (opts) => choice(instructions, opts);
  const forward = await askAll(scheduler, items, q, options, permute, template);
  const reversed = await askAll(scheduler, items, q, [...options].reverse(), permute, template);
  let delta = 0;
  for (let i = 0; i < items.length; i++)
    for (const o of options) delta += Math.abs(forward[i].probabilities[o] - reversed[i].probabilities[o]);
  const winners = forward.map((a) => Math.max(...Object.values(a.probabilities)));
  const correct = forward.map((a, i) => a.choice === items[i][1]);
  return {
    meanDelta: delta / (items.length * options.length),
    accuracy: correct.filter(Boolean).length / items.length,
    ece: ece(winners, correct),
  };
}

/** Yes/no facts: accuracy and ECE of p(yes) (the answer's confidence is max(p, 1 − p)). */
async function nouls(scheduler, permute, template) {
  const answers = await askAll(
    scheduler,
    FACTS,
    () => ({ type: 'noul', instructions: 'Is this statement true?' }),
    null,
    permute,
    template,
  );
  const correct = answers.map((a, i) => a.noul > 0.5 === FACTS[i][1]);
  const confidences = answers.map((a) => Math.max(a.noul, 1 - a.noul));
  return { accuracy: correct.filter(Boolean).length / FACTS.length, ece: ece(confidences, correct) };
}

async function main() {
  const threads = Number(args.threads || 2);
  const template = args.template || 'chat';
  const ctx = await createContext({ modelPath: modelPath(), nCtx: 8192, nSeqMax: 48, nThreads: threads });
  const scheduler = new Scheduler(ctx);
  const rows = [];
  for (const [name, items, instructions, options] of [
    ['sentiment (3 options)', SENTIMENT, 'What is the sentiment of this review?', SENTIMENTS],
    ['topic (4 options)', TOPIC, 'What is the topic of this headline?', TOPICS],
  ]) {
    for (const permute of [1, 2, options.length]) {
      const r = await choiceSet(scheduler, items, instructions, options, permute, template);
      rows.push([name, permute, r.meanDelta.toFixed(3), r.accuracy.toFixed(2), r.ece.toFixed(3)]);
    }
  }
  for (const permute of [1, 2]) {
    const r = await nouls(scheduler, permute, template);
    rows.push(['yes/no facts', permute, '—', r.accuracy.toFixed(2), r.ece.toFixed(3)]);
  }
  await scheduler.close();
  ctx.dispose();
  console.log(
    `machine: ${os.cpus().length} cores (${os.cpus()[0].model}), ${threads} threads, no GPU; template ${template}`,
  );
  console.log('| set | permute | mean abs(Δp), two orders | accuracy | ECE |');
  console.log('|---|---:|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
