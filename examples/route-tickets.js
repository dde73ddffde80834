#!/usr/bin/env node
'use strict';

// Routing support tickets with typed decisions: for each ticket, three closed questions — is it
// spam (noul), which team gets it (choice), how urgent is it (score) — answered with
// probabilities, nothing generated. Each ticket is one `scheduler.decide()`: the ticket is
// prefilled once and every question is a fork of it; the four tickets' decisions run at once, so
// their prefills and reads share the scheduler's steps. A ticket goes to its team only when the
// model is sure enough (the confidence threshold); otherwise to a person.

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/route-tickets.js [--jsonl] [--model path] [--permute k] [--threshold p]`;

const TICKETS = [
  { from: 'dana@example.com', subject: 'Charged twice', body: 'I was charged twice this month. Please refund one.' },
  { from: 'lee@example.com', subject: 'App crashes', body: 'The app crashes every time I open the settings page.' },
  { from: 'promo@win-big.example', subject: 'You won!!!', body: 'Click here to claim your free prize now.' },
  { from: 'sam@example.com', subject: 'Team plan', body: 'We are 40 people; what would a yearly team plan cost?' },
];

const QUESTIONS = {
  spam: { type: 'noul', instructions: 'Is this ticket spam or a scam?' },
  team: {
    type: 'choice',
    instructions: 'Which team should handle this ticket?',
    criteria: { billing: 'payments, invoices, refunds', technical: 'bugs, crashes, errors', sales: 'plans and prices' },
  },
  urgency: { type: 'score', instructions: 'How urgent is this ticket?', criteria: ['low', 'medium', 'high'] },
};

run(async () => {
  const flags = parseFlags(USAGE, { permute: 1, threshold: 0.3 });
  const { permute, threshold } = flags;
  const out = output(flags);
  const started = Date.now();
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax: 16 }));
  const scheduler = new Scheduler(ctx);
  out.trace(scheduler); // --jsonl: each decision's tree (ticket → question forks) for the page
  out.emit('start', { tickets: TICKETS.length, questions: Object.keys(QUESTIONS), permute, threshold });
  out.say(`routing ${TICKETS.length} tickets (permute ${permute})`);

  // Four decisions at once, each with maxBranches 4: the four fit beside each other in 16 leases.
  const results = await Promise.all(
    TICKETS.map((ticket) => scheduler.decide({ state: { ticket }, questions: QUESTIONS, permute, maxBranches: 4 })),
  );
  results.forEach(({ answers, usage }, i) => {
    const { spam, team, urgency } = answers;
    const route = spam.noul >= 0.5 ? 'spam' : team.confidence >= threshold ? team.choice : 'a person';
    out.emit('ticket', {
      index: i,
      route,
      spam: round(spam.noul, 4),
      team: team.choice,
      teamProbabilities: team.probabilities,
      confidence: round(team.confidence, 4),
      urgency: round(urgency.score, 4),
      inputTokens: usage.inputTokens,
    });
    out.say(
      `${oneLine(TICKETS[i].subject).padEnd(16)} → ${route.padEnd(10)} (team ${team.choice} ${team.confidence.toFixed(2)}, spam ${spam.noul.toFixed(2)}, urgency ${urgency.score.toFixed(2)} of 2)`,
    );
  });
  const stats = scheduler.stats();
  await scheduler.close();
  out.emit('complete', {
    prefilledTokens: stats.prefilledTokens,
    inputTokens: results.reduce((s, r) => s + r.usage.inputTokens, 0),
    generatedTokens: stats.generatedTokens,
    steps: stats.steps,
    elapsedMs: Date.now() - started,
  });
  out.say(`\n${stats.prefilledTokens} tokens prefilled in ${stats.steps} steps, nothing generated`);
  ctx.dispose();
});
