// tests/test_web_documents.py's driver: the page's documents module (its URL the first argument) on the
// job read from stdin, in JSON; the answers written to stdout, each offset in code points as Python counts.
import { readFileSync } from 'node:fs';

const D = await import(process.argv[2]);
const job = JSON.parse(readFileSync(0, 'utf8'));
const R = D.compileRules(job.rules);
const points = (s, i) => [...s.slice(0, i)].length;
const units = (s, i) => [...s].slice(0, i).join('').length;
const spansOf = (s, spans) => spans.map(([kind, a, b]) => ({ kind, start: units(s, a), end: units(s, b) }));
const segmenter = new Intl.Segmenter('en', { granularity: 'sentence' });
// the words of each sentence but those of `drops`: the test's engine, the same in Python
const engine = (drops) => async (xs) => xs.map((x) => x.split(' ').filter((w) => !drops.includes(w)).join(' '));
const matches = (text, source, flags) => [...text.matchAll(new RegExp(source, `${flags}g`))];
// a sentence of at most `limit` words: the test's length rule, the same in Python
const within = (limit) => (limit ? (t) => t.split(/\s+/).filter(Boolean).length <= limit : null);
const named = D.compileRules(job.rules, job.words ?? []);

const out = {
  matches: job.texts.map((t) => job.rules.spans.map(({ source, flags }) =>
    matches(t, source, flags).map((m) => [points(t, m.index), points(t, m.index + m[0].length)]))),
  spans: job.texts.map((t) => D.findSpans(t, R).map((s) => [s.kind, points(t, s.start), points(t, s.end)])),
  classes: Object.fromEntries(Object.entries(job.classes).map(([name, { source, flags }]) =>
    [name, matches(job.everything, source, flags).map((m) => m[0].codePointAt(0))])),
  masked: job.mask.map(([sentence, spans, attempt]) => {
    const m = D.mask(sentence, spansOf(sentence, spans), R, attempt);
    return [m.text, m.standIns, m.originals];
  }),
  unmasked: job.unmask.map(([sentence, spans, translation]) => {
    const m = D.mask(sentence, spansOf(sentence, spans), R);
    const u = D.unmask(m, translation.replace(/\{(\d+)\}/g, (_, k) => m.standIns[k] ?? ''), R);
    return [u.text, u.placed];
  }),
  sentences: job.split.map((t) => D.splitSentences(t, D.findSpans(t, R), R, segmenter).map(([a, b]) => t.slice(a, b))),
  translated: await Promise.all(job.translate.map(({ texts, drops, fold, limit }) =>
    D.translateTexts(texts, engine(drops), job.words ? named : R, segmenter, fold, within(limit)))),
  cut: (job.cut ?? []).map(([sentence, limit]) =>
    D.cutLong(sentence, within(limit), R).map(([a, b]) => sentence.slice(a, b))),
  names: (job.names ?? []).map((t) => D.findSpans(t, named).map((s) => [s.kind, points(t, s.start), points(t, s.end)])),
};
process.stdout.write(JSON.stringify(out));
