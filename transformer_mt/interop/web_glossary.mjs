// Glossaries in the page of `export format=web`: the lines people paste (`source term<TAB>target term`),
// where a text holds source terms, and the token ids a target term can take. Each function names its
// Python original (decoding/glossary.py, decoding/constraints.py) and follows it rule for rule; what the
// export writes into the page's settings (`settings.glossary`, interop/web_rules.py::glossary_rules) are
// Python's character classes: its \w and \s, and which characters its `re` matches alike when case is
// ignored (JavaScript's `i` flag folds case otherwise). Positions are JavaScript's (UTF-16 code units).

const escaped = (text) => text.replace(/[\\^$.*+?()[\]{}|/]/g, '\\$&');
const points = (text) => [...text];  // code points, as Python counts a string's length
// Python's repr of a string (one with no control character): how its messages quote a term.
const repr = (text) => {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  return quote + text.replace(/\\/g, '\\\\').replaceAll(quote, `\\${quote}`) + quote;
};

// The settings' classes, ready to build patterns with: `cases` maps a character to the class of those
// Python's re matches it with when case is ignored.
export function compileClasses(rules) {
  const cases = new Map();
  for (const group of rules.cases) {
    const members = points(group);
    const klass = `[${members.map((c) => c.replace(/[\\\]\[^-]/g, '\\$&')).join('')}]`;
    for (const c of members) cases.set(c, klass);
  }
  return {
    word: rules.word,
    spaces: new RegExp(`${rules.space}+`, 'gu'),
    space: rules.space,
    edge: new RegExp(`^${rules.space}+|${rules.space}+$`, 'gu'),
    cases,
    ordinary: rules.ordinary,
  };
}

// `_SPACES.sub(" ", side).strip()`: runs of whitespace as one space, none around.
const tidy = (text, K) => text.replace(K.spaces, ' ').replace(K.edge, '');
const anyCase = (c, K) => K.cases.get(c) ?? escaped(c);  // Python's (?i:c)

const joined = (words, K) => words.join(`${K.space}+`);  // a space: any run of whitespace
// Words in any case, as Python's (?i:...) matches them.
const anyCaseSource = (words, K) => joined(words.map((w) => points(w).map((c) => anyCase(c, K)).join('')), K);

// `_pattern`: one source term's pattern. An entry in lowercase matches in any case; one with a capital
// as written, its first letter in either case; a space matches any run of whitespace.
export function termSource(source, K) {
  const words = source.split(' ');
  if (source === source.toLowerCase()) return anyCaseSource(words, K);
  const [head, ...rest] = points(words[0]);
  return joined([anyCase(head, K) + escaped(rest.join('')), ...words.slice(1).map(escaped)], K);
}

// `_entry`: one `source<TAB>target` line, or the one-line reason it cannot be used.
function entry(line, number, name, K) {
  const columns = line.split('\t');
  if (columns.length !== 2) {
    const found = columns.length === 1 ? 'no tab' : `${columns.length} tab-separated columns`;
    throw new Error(`${name}: line ${number} has ${found}; write \`source term<TAB>target term\`, `
      + 'one pair a line');
  }
  const [source, target] = columns.map((c) => tidy(c, K));
  if (!source || !target) {
    throw new Error(`${name}: line ${number} has an empty ${source ? 'target' : 'source'} term; write `
      + '`source term<TAB>target term`');
  }
  return { source, target, line: number };
}

// `Glossary.read` of pasted text: its entries (blank lines and `#` lines skipped, a byte-order mark too);
// an Error of one line naming the line of anything unusable.
export function readGlossary(text, K, name = 'glossary') {
  const lines = text.replace(/^\ufeff/, '').split(/\r\n|\r|\n/);
  if (lines.length && !lines[lines.length - 1]) lines.pop();
  return lines.flatMap((line, i) => {
    const shown = tidy(line, K);
    return shown && !shown.startsWith('#') ? [entry(line, i + 1, name, K)] : [];
  });
}

// `Glossary.merged`: the entries of two glossaries, the second's first and winning for a source term both
// have (pasted lines over the exported glossary).
export function merged(first, second) {
  const replaced = new Set(second.map((e) => e.source));
  return [...second, ...first.filter((e) => !replaced.has(e.source))];
}

// `Glossary.__init__`: each source term once (a second target for it is an Error of one line), longest
// first, and the one pattern that finds, at each start, the longest entry there.
export function compileGlossary(entries, K, name = 'glossary') {
  const bySource = new Map();
  for (const e of entries) {
    const seen = bySource.get(e.source);
    if (seen && seen.target !== e.target) {
      throw new Error(`${name}: line ${e.line} gives ${repr(e.source)} the target ${repr(e.target)}, line `
        + `${seen.line} gave it ${repr(seen.target)}; keep one`);
    }
    if (!seen) bySource.set(e.source, e);
  }
  const length = (e) => points(e.source).length;
  const sorted = [...bySource.values()].map((e, i) => [e, i])  // longest first, else in their order
    .sort(([a, i], [b, j]) => length(b) - length(a) || i - j).map(([e]) => e);
  const sources = sorted.map((e) => termSource(e.source, K));
  const alternatives = sources.map((s) => `(${s})(?!${K.word})`).join('|');
  return {
    entries: sorted,
    regex: sorted.length ? new RegExp(`(?<!${K.word})(?=(?:${alternatives}))`, 'gu') : null,
    at: sources.map((s) => new RegExp(`(?:${s})(?!${K.word})`, 'uy')),  // one entry, at one place
  };
}

// Python's tuple order: the first place where they differ decides.
function before(a, b) {
  const k = a.findIndex((x, i) => x !== b[i]);
  return k >= 0 && a[k] < b[k];
}

// `Glossary.find`: the source terms of `text`, in text order, as {start, end, entry}: whole words, the
// case rule, the longest entry first, no overlap.
export function findTerms(text, G) {
  if (!G.regex) return [];
  const heap = [];  // [-length, start, index, end], taken smallest first as Python's heapq takes them
  for (const m of text.matchAll(G.regex)) {
    const index = m.findIndex((g, k) => k > 0 && g !== undefined) - 1;
    heap.push([-points(G.entries[index].source).length, m.index, index, m.index + m[index + 1].length]);
  }
  const taken = [];
  while (heap.length) {
    let best = 0;
    heap.forEach((h, k) => { if (before(h, heap[best])) best = k; });
    const [, start, index, end] = heap.splice(best, 1)[0];
    if (taken.every((t) => end <= t.start || t.end <= start)) {
      taken.push({ start, end, entry: G.entries[index] });
      continue;
    }
    for (let next = index + 1; next < G.entries.length; next++) {  // `_next_at`: a shorter entry here
      G.at[next].lastIndex = start;
      const m = G.at[next].exec(text);
      if (m) {
        heap.push([-points(G.entries[next].source).length, start, next, start + m[0].length]);
        break;
      }
    }
  }
  return taken.sort((a, b) => a.start - b.start);
}

// `constraints._minimal`: distinct, non-empty variants of ordinary tokens, minus those holding another as
// a run.
function minimal(variants, ordinary) {
  const keys = new Set();
  const usable = [];
  for (const v of variants) {
    const key = v.join(',');
    if (keys.has(key)) continue;
    keys.add(key);
    if (v.length && Math.min(...v) >= ordinary) usable.push(v);
  }
  const holds = (long, short) => long.length > short.length
    && long.some((_, i) => i + short.length <= long.length && short.every((x, k) => long[i + k] === x));
  return usable.filter((v) => !usable.some((w) => holds(v, w)));
}

// `constraints.term_variants`: the token ids a target term can take, after a space, glued to what
// precedes (or at the start), and both with a capital first letter when it starts in lowercase; `encode`
// gives a text's ids without special tokens. Empty when the vocabulary cannot write the term.
export function termVariants(encode, target, K) {
  const [first = ''] = points(target);
  const texts = [target];
  if (/^\p{Lowercase}$/u.test(first)) texts.push(first.toUpperCase() + target.slice(first.length));
  const anchor = encode('a');
  const variants = [];
  for (const text of texts) {
    const glued = encode(text);
    const spaced = encode(`a ${text}`);
    variants.push(glued);
    if (anchor.every((id, i) => spaced[i] === id) && spaced.length >= anchor.length) {
      variants.push(spaced.slice(anchor.length));
    }
  }
  return minimal(variants, K.ordinary);
}

// `holds_term`: whether a translation holds a target term, as whole words, in any case.
export function holdsTerm(text, target, K) {
  const source = anyCaseSource(target.split(' '), K);
  return new RegExp(`(?<!${K.word})(?:${source})(?!${K.word})`, 'u').test(text);
}

// An entry with its target term's token ids (`termVariants`); an Error of one line when the model cannot
// write the term, or not within its `positions` (`GlossaryUser.use_glossary`, as an engine refuses one).
export function withVariants(entry, encode, K, positions, name = 'glossary') {
  const variants = termVariants(encode, entry.target, K);
  const where = `${name}: line ${entry.line}`;
  if (!variants.length) {
    throw new Error(`${where}: this model's vocabulary cannot write the target term ${repr(entry.target)} (a `
      + 'word or character it never saw); spell it with words the model knows or drop the line');
  }
  const fewest = Math.min(...variants.map((v) => v.length));
  if (fewest > positions - 1) {
    throw new Error(`${where}: the target term takes ${fewest} tokens; this model writes at most `
      + `${positions - 1}: shorten it`);
  }
  return { ...entry, variants };
}
