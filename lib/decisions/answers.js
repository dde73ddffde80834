'use strict';

/**
 * Answers in each format from a planned question's option probabilities (option order): System
 * One's (a record by question name: `noul`, `choice` + probabilities by name, `score` + legend)
 * and OpenAI's Decisions API's (a list in question order: `probability`, `choice` + `[{ value,
 * probability }]`, `score` + `[{ label, value, probability }]`, or a `refusal`).
 */

const { confidenceOf } = require('./ask');

const argmax = (p) => p.reduce((b, x, i) => (x > p[b] ? i : b), 0);
const expected = (p) => p.reduce((s, x, i) => s + i * x, 0);

/** System One's answer to `question`. */
function systemOneAnswer(question, p) {
  if (question.type === 'noul') return { type: 'noul', noul: p[0] };
  const probabilities = {};
  question.options.forEach((o, i) => {
    probabilities[o.name] = p[i];
  });
  const confidence = confidenceOf(p);
  if (question.type === 'choice')
    return { type: 'choice', choice: question.options[argmax(p)].name, probabilities, confidence };
  const legend = {};
  question.options.forEach((o, i) => {
    legend[String(i)] = o.name;
  });
  return { type: 'score', score: expected(p), legend, probabilities, confidence };
}

/** OpenAI's answer to `question` (`p` null: refused). */
function openAIAnswer(question, p) {
  const { name } = question;
  if (!p) return { type: 'refusal', name };
  if (question.type === 'noul') return { type: 'predicate', name, probability: p[0] };
  const confidence = confidenceOf(p);
  if (question.type === 'choice') {
    const probabilities = question.options.map((o, i) => ({ value: o.value, probability: p[i] }));
    return { type: 'choice', name, choice: question.options[argmax(p)].value, probabilities, confidence };
  }
  const probabilities = question.options.map((o, i) => ({ label: o.name, value: i, probability: p[i] }));
  return { type: 'score', name, score: expected(p), probabilities, confidence };
}

/**
 * The answers of a decision in `format`: `probabilities` holds, per question in order, its
 * options' probabilities or null when it was refused.
 */
function answersOf(format, questions, probabilities) {
  if (format === 'openai') return questions.map((q, i) => openAIAnswer(q, probabilities[i]));
  const answers = {};
  questions.forEach((q, i) => {
    answers[q.name] = systemOneAnswer(q, probabilities[i]);
  });
  return answers;
}

module.exports = { answersOf };
