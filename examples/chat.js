#!/usr/bin/env node
'use strict';

// Interactive streaming chat with warm multi-turn prefill. Reads one user message per line from
// stdin and streams the reply token by token. The first turn formats the conversation with the
// model's chat template (ctx.formatChat) and prefills it; every later turn prefills only what is
// new (the turn separator that closes the assistant's reply, then the new user turn formatted on
// its own), so nothing already in the KV cache is decoded again. `/clear` starts over; end of
// input (Ctrl-D, or the end of a pipe) exits with code 0.
//
//   node examples/chat.js
//   printf 'Hi, I am Ada.\nWhat is my name?\n' | node examples/chat.js

const readline = require('node:readline');
const { createContext, Branch } = require('llama-branch');
const { parseFlags, contextOptions, output, run } = require('./_common');

const USAGE = `usage: node examples/chat.js [--jsonl] [--model path] [--max-tokens 120] [--temperature 0.7]
                            [--seed 1] [--system text]
  one message per line on stdin; /clear resets the conversation; EOF exits`;

run(async () => {
  const flags = parseFlags(USAGE, { maxTokens: 120, temperature: 0.7, seed: 1, system: '' });
  const out = output(flags);
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax: 1 }));
  const interactive = process.stdin.isTTY && !flags.jsonl;
  out.emit('start', { model: ctx.modelDescription, nCtx: ctx.nCtx });
  out.say(`chatting with ${ctx.modelDescription} (/clear resets, Ctrl-D exits)`);

  let chat = null; // the conversation's branch; null before the first turn
  let turns = 0;
  // On a terminal readline echoes and edits the line; from a pipe it just splits lines.
  const rl = interactive
    ? readline.createInterface({ input: process.stdin, output: process.stdout, terminal: true, prompt: '> ' })
    : readline.createInterface({ input: process.stdin, terminal: false });
  // Ctrl-C stops the reply being streamed and ends the session like Ctrl-D.
  let interrupted = false;
  rl.on('SIGINT', () => {
    interrupted = true;
    rl.close();
  });
  const prompt = () => {
    if (interactive && !interrupted) {
      process.stdout.write('\n');
      rl.prompt();
    }
  };
  prompt();

  for await (const line of rl) {
    if (interrupted) break;
    const message = line.trim();
    if (message === '') {
      if (interactive) rl.prompt();
      continue;
    }
    if (message === '/clear') {
      if (chat) await chat.prune();
      chat = null;
      out.emit('clear');
      out.say('(conversation cleared)');
      prompt();
      continue;
    }

    const warm = chat !== null;
    const started = Date.now();
    let format;
    let prefill;
    if (!warm) {
      // Cold: the whole conversation so far (system prompt + this message), BOS included.
      const messages = [
        ...(flags.system ? [{ role: 'system', content: flags.system }] : []),
        { role: 'user', content: message },
      ];
      format = await ctx.formatChat(messages);
      prefill = await ctx.tokenize(format.prompt);
      chat = Branch.create(ctx, 0, {
        temperature: flags.temperature,
        seed: flags.seed,
        penalties: { repeat: 1.15, lastN: 64 },
      });
    } else {
      // Warm: close the previous reply, then only the new turn (an empty system message first
      // makes formatChat render the turn as it appears after earlier ones). No BOS.
      format = await ctx.formatChat([
        { role: 'system', content: '' },
        { role: 'user', content: message },
      ]);
      prefill = [...ctx.getTurnSeparator(), ...(await ctx.tokenize(format.prompt, false))];
    }
    try {
      await chat.prefill(prefill);
    } catch (e) {
      if (e.code !== 'ERR_KV_FULL') throw e;
      out.say('(the conversation no longer fits in the context; clearing it)');
      await chat.prune();
      chat = null;
      out.emit('clear', { reason: 'ERR_KV_FULL' });
      continue;
    }
    const firstTokenAfter = Date.now() - started;

    // Stream the reply; the iterator stops (without decoding it) at the end-of-turn token.
    let reply = '';
    let tokens = 0;
    if (!flags.jsonl) process.stdout.write(interactive ? '' : '< ');
    for await (const { text } of chat) {
      reply += text;
      tokens++;
      out.write(text);
      out.emit('token', { turn: turns, text });
      if (tokens >= flags.maxTokens || interrupted) break;
    }
    const parsed = ctx.parseChatOutput(reply, format.format, format);
    out.write('\n');
    out.emit('turn', {
      turn: turns,
      warm,
      user: message,
      content: parsed.content,
      tokens,
      prefillTokens: prefill.length,
      position: chat.position,
      prefillMs: firstTokenAfter,
      elapsedMs: Date.now() - started,
    });
    turns++;
    prompt();
  }

  // End of input: leave cleanly.
  if (chat) await chat.prune();
  out.emit('complete', { turns });
  if (interactive) process.stdout.write('\n');
  ctx.dispose();
});
