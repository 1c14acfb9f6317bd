// tests/test_web_glossary.py's driver: the page's glossary, search and documents modules (their URLs the
// arguments) on the job read from stdin, in JSON; the answers written to stdout, offsets in code points as
// Python counts them.
import { readFileSync } from 'node:fs';

const [G, S, D] = await Promise.all(process.argv.slice(2, 5).map((url) => import(url)));
const job = JSON.parse(readFileSync(0, 'utf8'));
const K = G.compileClasses(job.glossary);
const points = (s, i) => [...s.slice(0, i)].length;

// A model whose logits depend on the last token, the one before it and the position, from the job's
// float32 tables (PyTorch adds them in float32, in this order): `bankGreedy`'s decoder, one row a history.
function tableDecoder({ last, before, at }, bos) {
  let rows = [[bos]];
  return {
    async step(parents, tokens) {
      rows = parents ? parents.map((p, i) => [...rows[p], tokens[i]]) : rows;
      return rows.map((h) => {
        const i = h.length - 1;
        const [tok, prev] = [h[i], h[Math.max(i - 1, 0)]];
        const sum = (x, v) => Math.fround(Math.fround(x + before[prev][v]) + at[i % at.length][v]);
        return Float32Array.from(last[tok], sum);
      });
    },
  };
}

const found = (entries, text) => G.findTerms(text, G.compileGlossary(entries, K))
  .map((m) => [points(text, m.start), points(text, m.end), m.entry.source]);

// An engine that writes each sentence back (its words in `drops` left out) and its terms' targets after
// it, as the Python test's TermEcho, and keeps what it was given.
const given = [];
const engine = (drops) => async (sentences, terms) => {
  given.push(sentences.map((s, k) => [s, terms[k].map((e) => e.source)]));
  return sentences.map((s, k) => [...s.split(' ').filter((w) => !drops.includes(w)), ...terms[k].map((e) => e.target)]
    .join(' '));
};
const within = (limit) => (limit ? (t) => t.split(/\s+/).filter(Boolean).length <= limit : null);
const R = D.compileRules(job.rules);
const segmenter = new Intl.Segmenter('en', { granularity: 'sentence' });

const out = {
  found: job.find.map(({ entries, texts }) => texts.map((t) => found(entries, t))),
  letters: job.letters.map((c) => found([{ source: c, target: 'x', line: 1 }], job.text).map(([a]) => a)),
  read: job.read.map((text) => {  // as the page reads pasted lines: each line, then the glossary of all
    try {
      return G.compileGlossary(G.readGlossary(text, K, 'pasted'), K, 'pasted').entries;
    } catch (e) {
      return e.message;
    }
  }),
  holds: job.holds.map(([text, target]) => G.holdsTerm(text, target, K)),
  searched: await Promise.all(job.search.map(async ({ tables, terms, maxLen, edges }) => {
    const ends = { maxLen, eos: job.eos, banned: job.banned, positions: job.positions,
                   edges: edges && S.wordEdges(edges) };
    const best = await S.bankGreedy(tableDecoder(tables, job.bos), terms, ends);
    return best && [best.tokens, best.score];
  })),
  fitted: job.fit.map(([entries, room]) => S.sentenceTerms(entries, room)),
  variants: job.variants.map(([target, positions]) => {  // a character a token; ü unknown (<unk>, 3)
    const encode = (text) => [...text].map((c) => (c === 'ü' ? 3 : (c.codePointAt(0) % 40) + 4));
    try {
      return G.withVariants({ source: 's', target, line: 2 }, encode, K, positions, 'pasted').variants;
    } catch (e) {
      return e.message;
    }
  }),
  edges: job.edges.map(({ bits, n }) => {
    const edges = S.wordEdges(bits);
    return [...Array(n).keys()].map((v) => [edges.glues(v), edges.ends(v)]);
  }),
  translated: [],
};
for (const { texts, entries, drops, fold, limit } of job.translate) {
  const C = G.compileGlossary(entries, K);
  const uses = (terms, text) => terms.map((e) => ({ status: G.holdsTerm(text, e.target, K) ? 'met' : 'missing' }));
  const glossary = { find: (text) => G.findTerms(text, C), uses };
  given.length = 0;
  const done = await D.translateTexts(texts, engine(drops), R, segmenter, fold, within(limit), glossary);
  out.translated.push({ ...done, given: given.slice() });
}
process.stdout.write(JSON.stringify(out));
