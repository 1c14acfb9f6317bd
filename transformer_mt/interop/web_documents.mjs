// The documents layer (transformer_mt/documents/) for the page of `export format=web`: texts split into
// sentences, protected spans (numbers, prices, times, years, e-mails, URLs, paths, codes) replaced by
// stand-ins the model copies, every sentence of every text translated in one call, the spans restored
// and the translations joined with the texts' own separators.
//
// The rules (patterns, stand-ins) are not written here: `export format=web` writes Python's into the
// page's settings (interop/web_rules.py), and `compileRules` builds them. What is written here is how
// they are applied, as documents/spans.py, masking.py, pipeline.py and joining.py apply them; each
// function names its Python original. Positions are JavaScript's (UTF-16 code units) throughout.

const escaped = (text) => text.replace(/[\\^$.*+?()[\]{}|/]/g, '\\$&');

// The settings' rules as regular expressions; `words`: the model's training words (case folded), whose
// absence makes a capitalised word a name to copy (null: no names kept).
export function compileRules(rules, words = null) {
  const regex = (r, extra = '') => new RegExp(r.source, r.flags + extra);
  return {
    name: regex(rules.name, 'g'),
    known: words ? new Set(words) : null,
    folds: rules.folds,
    clause: regex(rules.clause, 'g'),
    spaces: regex(rules.spaces, 'g'),
    attached: regex(rules.attached),
    joiners: new Set(rules.joiners),
    spans: rules.spans.map((s) => ({ kind: s.kind, pattern: regex(s, 'g') })),
    trimmed: new Set(rules.trimmed),
    trailing: rules.trailing,
    ordinal: regex(rules.ordinal, 'y'),
    standIns: rules.stand_ins,
    words: regex(rules.words, 'g'),
    around: rules.around_stand_in,
    final: regex(rules.final),
    space: regex(rules.space),  // one character of Python's str.isspace()
    leading: new RegExp(`^${rules.space.source}*`, 'u'),
    trailingSpace: new RegExp(`${rules.space.source}*$`, 'u'),
  };
}

// -- spans (documents/spans.py) --------------------------------------------------------------------------

// `_trim`: an address's end without the sentence's punctuation after it (a closing bracket stays when the
// address opened one).
function trim(text, start, end, R) {
  const count = (c) => [...text.slice(start, end)].filter((x) => x === c).length;
  while (end > start && R.trailing.includes(text[end - 1])) {
    if (text[end - 1] === ')' && count('(') >= count(')')) break;
    end -= 1;
  }
  return end;
}

function ordinalAt(text, start, R) {  // `ORDINAL.match(text, start)`
  R.ordinal.lastIndex = start;
  return R.ordinal.test(text);
}

// Python's `str.casefold`: each character's folding where it is not its lowercase (the settings' table).
function casefold(text, R) {
  return Array.from(text, (c) => R.folds[c] ?? c.toLowerCase()).join('');
}

// `find_spans` (no user terms, no given ranges): the glossary's source terms in `text` first (`terms`,
// {start, end, entry} each: kind 'glossary', left unmasked for the model to read), then each kind's
// matches in turn, the first to claim a character keeping it; then, with the training words, the
// capitalised words that none of them is (compared case folded, as Python compares them).
export function findSpans(text, R, terms = []) {
  const taken = new Uint8Array(text.length);
  const found = [];
  const claim = (start, end, kind, more = {}) => {
    if (end > start && !taken.subarray(start, end).some((t) => t)) {
      taken.fill(1, start, end);
      found.push({ start, end, kind, ...more });
    }
  };
  for (const { start, end, entry } of terms) claim(start, end, 'glossary', { entry });
  for (const { kind, pattern } of R.spans) {
    for (const m of text.matchAll(pattern)) {
      const start = m.index;
      const end = R.trimmed.has(kind) ? trim(text, start, start + m[0].length, R) : start + m[0].length;
      if (kind === 'number' && ordinalAt(text, start, R)) continue;  // "2nd" is a word to translate
      claim(start, end, kind);
    }
  }
  const names = [];  // names one space apart are one ("José María"), as in Python
  for (const m of R.known ? text.matchAll(R.name) : []) {
    const unknown = m[0].split('-').some((part) => !R.known.has(casefold(part, R)));
    if (!(/^\p{Lu}/u.test(m[0]) && unknown)) continue;
    const last = names[names.length - 1];
    if (last && text.slice(last[1], m.index) === ' ') last[1] = m.index + m[0].length;
    else names.push([m.index, m.index + m[0].length]);
  }
  for (const [start, end] of names) claim(start, end, 'name');
  return found.sort((a, b) => a.start - b.start);
}

// -- sentences (documents/sentences.py, with the browser's segmenter) ------------------------------------

// `_stripped`: [start, end) without the whitespace around it; null when it is all whitespace.
function stripped(text, start, end, R) {
  const part = text.slice(start, end);
  const left = part.match(R.leading)[0].length;
  if (left === part.length) return null;
  return [start + left, end - part.match(R.trailingSpace)[0].length];
}

// `_lines`: the [start, end) of each line, its line break left out.
function lines(text) {
  const found = [];
  let start = 0;
  for (const m of text.matchAll(/\r\n|\r|\n/g)) {
    found.push([start, m.index]);
    start = m.index + m[0].length;
  }
  return [...found, [start, text.length]];
}

// `SentenceSplitter.split`: the [start, end) of each sentence, without the whitespace around it. A line
// break ends a sentence; no sentence ends inside a span (the sentences on both sides are one).
export function splitSentences(text, spans, R, segmenter) {
  const ranges = [];
  for (const [start, end] of lines(text)) {
    for (const { index, segment } of segmenter.segment(text.slice(start, end))) {
      const range = stripped(text, start + index, start + index + segment.length, R);
      if (range) ranges.push(range);
    }
  }
  const merged = ranges.slice(0, 1);
  for (const [i, range] of ranges.entries()) {  // `_merged`: a span reaching into both joins them
    if (i === 0) continue;
    const across = spans.some((s) => s.start < ranges[i - 1][1] && ranges[i][0] < s.end);
    if (across) merged[merged.length - 1] = [merged[merged.length - 1][0], range[1]];
    else merged.push(range);
  }
  return merged;
}

// -- long sentences (documents/sentences.py) -------------------------------------------------------------

// `_attached`: whether the character at `at` belongs with the one before it (a combining mark, a
// modifier, either side of a joiner, or the second half of a character of two UTF-16 units).
function attached(text, at, R) {
  const unit = text.charCodeAt(at);
  if (unit >= 0xdc00 && unit <= 0xdfff) return true;
  const c = String.fromCodePoint(text.codePointAt(at));
  return R.attached.test(c) || R.joiners.has(c) || R.joiners.has(text[at - 1]);
}

// `_middle_cut`: where to cut [start, end) in two: the clause boundary nearest the middle, else the space
// between words nearest it, else the cut between characters nearest it, never inside a `keep` range (a
// span, a glossary term); null for one character, or where every cut would fall inside one.
function middleCut(text, start, end, R, keep) {
  const free = (c) => !keep.some((k) => k.start < c && c < k.end);
  const middle = (start + end) / 2;
  const nearest = (cuts) => cuts.reduce((best, c) => (Math.abs(c - middle) < Math.abs(best - middle) ? c : best));
  for (const pattern of [R.clause, R.spaces]) {
    pattern.lastIndex = start;
    const cuts = [...text.slice(0, end).matchAll(pattern)].map((m) => m.index + m[0].length)
      .filter((c) => c > start && c < end && free(c));
    if (cuts.length) return nearest(cuts);
  }
  const inside = [];
  for (let c = start + 1; c < end; c++) if (!attached(text, c, R) && free(c)) inside.push(c);
  const floor = Math.floor((start + end) / 2);  // as Python's `_character_cut` sorts them: by distance
  return inside.length ? inside.reduce((best, c) => (Math.abs(c - floor) < Math.abs(best - floor) ? c : best))
    : null;
}

// `cut_long`: ranges of `sentence`, in order, each without the whitespace around it and each that `fits`
// accepts: a part that does not fit is halved at `middleCut`, until it fits or is one character; no cut
// falls inside a range of `keep` (a part that could only be cut there stays whole).
export function cutLong(sentence, fits, R, keep = []) {
  const whole = stripped(sentence, 0, sentence.length, R);
  const parts = [];
  const todo = whole ? [whole] : [];
  while (todo.length) {  // a stack of ranges still to check, the leftmost on top
    const [start, end] = todo.pop();
    const cut = fits(sentence.slice(start, end)) ? null : middleCut(sentence, start, end, R, keep);
    if (cut === null) {
      parts.push([start, end]);
      continue;
    }
    const halves = [stripped(sentence, start, cut, R), stripped(sentence, cut, end, R)];
    for (const half of halves.reverse()) if (half) todo.push(half);
  }
  return parts;
}

// -- stand-ins (documents/masking.py) --------------------------------------------------------------------

function rewritten(text, edits) {  // `Rewrite.of(...).new`
  let out = '';
  let at = 0;
  for (const e of [...edits].sort((a, b) => a.start - b.start)) {
    out += text.slice(at, e.start) + e.text;
    at = e.end;
  }
  return out + text.slice(at);
}

// `blanked`: the sentence with its spans blanked out.
export function blanked(sentence, spans) {
  return rewritten(sentence, spans.map((s) => ({ ...s, text: ' '.repeat(s.end - s.start) })));
}

// `mask`: each span replaced by a stand-in (the `attempt`-th free one), none that the sentence holds
// elsewhere nor one of the words `reserved` (those of the glossary's target terms, which the translation
// will hold), no two alike; `typed`: the sentence as typed, where `sentence` is it folded.
export function mask(sentence, spans, R, attempt = 0, typed = sentence, reserved = []) {
  const present = new Set([...(blanked(sentence, spans).match(R.words) || []), ...reserved]
    .map((w) => w.toLowerCase()));
  const used = new Set();
  const standIns = spans.map(() => {
    const free = R.standIns.filter((s) => !present.has(s.toLowerCase()) && !used.has(s));
    const choice = free.length ? free[attempt % free.length] : `${R.standIns[0]}${used.size}`;
    used.add(choice);
    return choice;
  });
  return {
    source: sentence,
    text: rewritten(sentence, spans.map((s, k) => ({ ...s, text: standIns[k] }))),
    spans,
    originals: spans.map((s) => typed.slice(s.start, s.end)),
    standIns,
    reserved,
  };
}

const standInPattern = (standIn, R) => new RegExp(R.around[0] + escaped(standIn) + R.around[1], 'giu');

// `missing`: the spans whose stand-in the translation does not hold.
export function missing(masked, translation, R) {
  return masked.standIns.filter((s) => !standInPattern(s, R).test(translation));
}

// `_before_final`: `text` after the translation's last word, before its final punctuation (a space
// before a full stop dropped, one before ? or ! kept).
function beforeFinal(translation, text, R) {
  const tail = R.final.exec(translation);
  const end = tail ? tail.index : translation.length;
  const space = translation.slice(end).match(R.leading)[0].length;
  const next = translation.slice(end + space, end + space + 1);
  const keep = next !== '.' && next !== '…' ? translation.slice(end, end + space) : '';
  const lead = end && !R.space.test(translation[end - 1]) ? ' ' : '';
  return { start: end, end: end + space, text: lead + text + keep };
}

// `unmask`: each stand-in found (as a whole word, any case) replaced by its span; a span whose stand-in
// is missing placed before the final punctuation, and counted.
export function unmask(masked, translation, R) {
  const edits = [];
  const placed = [];
  masked.standIns.forEach((standIn, k) => {
    const found = [...translation.matchAll(standInPattern(standIn, R))].filter(
      (m) => !edits.some((e) => e.start < m.index + m[0].length && m.index < e.end));
    if (!found.length) placed.push(masked.originals[k]);
    for (const m of found) edits.push({ start: m.index, end: m.index + m[0].length, text: masked.originals[k] });
  });
  if (placed.length) edits.push(beforeFinal(translation, placed.join(' '), R));
  return { text: rewritten(translation, edits), placed: placed.length };
}

// -- case (data/text_variants.py) ------------------------------------------------------------------------

// `one_case`: 'caps' for ALL CAPS, 'lower' for lowercase (two letters or more), else null.
export function oneCase(text) {
  if ((text.match(/\p{L}/gu) || []).length < 2) return null;
  const upper = /\p{Uppercase}/u.test(text);
  const lower = /\p{Lowercase}/u.test(text);
  if (/\p{Lt}/u.test(text) || upper === lower) return null;
  return upper ? 'caps' : 'lower';
}

// `sentence_case`: lower-cased but for its first letter.
export function sentenceCase(text) {
  const lower = text.toLowerCase();
  const first = /\p{L}/u.exec(lower);
  return first ? lower.slice(0, first.index) + first[0].toUpperCase() + lower.slice(first.index + first[0].length)
    : lower;
}

const CASES = { caps: (t) => t.toUpperCase(), lower: (t) => t.toLowerCase() };
const cased = (p, translation) => (p.kase ? CASES[p.kase](translation) : translation);  // `_cased`

// -- texts through the model (documents/pipeline.py, joining.py) -----------------------------------------

// `DocumentTranslator._part`: one sentence, masked; folded to sentence case when it is in ALL CAPS or
// lowercase, around its stand-ins. Its glossary terms are not masked: they stay in the text the model
// reads, and `terms` lists their entries.
function part(index, text, start, end, spans, fold, R) {
  const sentence = text.slice(start, end);
  const kept = spans.filter((s) => s.kind !== 'glossary');
  const terms = spans.filter((s) => s.kind === 'glossary').map((s) => s.entry);
  let kase = fold ? oneCase(blanked(sentence, kept)) : null;
  let folded = kase ? sentenceCase(sentence) : sentence;
  if (folded.length !== sentence.length) [kase, folded] = [null, sentence];
  const reserved = terms.flatMap((e) => e.target.match(R.words) || []);
  return { text: index, start, end, kase, terms, masked: mask(folded, kept, R, 0, sentence, reserved) };
}

// `DocumentTranslator.prepare`: every text's sentences, cut where `fits` refuses them (null: none is),
// their spans masked; how many sentences there were, and how many were cut. `find`: the glossary's
// source terms in a text (null: no glossary); no sentence ends, and no cut falls, inside a span or one.
export function prepare(texts, R, segmenter, fold, fits = null, find = null) {
  const parts = [];
  const counts = { sentences: 0, cut: 0 };
  texts.forEach((text, index) => {
    const spans = findSpans(text, R, find ? find(text) : []);
    for (const [start, end] of splitSentences(text, spans, R, segmenter)) {
      const keep = spans.filter((s) => start <= s.start && s.end <= end)
        .map((s) => ({ start: s.start - start, end: s.end - start }));
      const pieces = fits ? cutLong(text.slice(start, end), fits, R, keep) : [[0, end - start]];
      counts.sentences += 1;
      counts.cut += pieces.length > 1;
      for (const [a, b] of pieces) {
        const inside = spans.filter((s) => start + a <= s.start && s.end <= start + b)
          .map((s) => ({ ...s, start: s.start - start - a, end: s.end - start - a }));
        parts.push(part(index, text, start + a, start + b, inside, fold, R));
      }
    }
  });
  return { parts, counts };
}

// `translate_parts`'s second try: the parts whose stand-in the model dropped, masked with the next
// stand-ins of their pools and translated once more, kept where fewer are dropped (`raw`: the engine's
// translations before they were cased).
async function retried(parts, found, raw, engine, R, tally) {
  const retry = parts.flatMap((p, k) => (missing(p.masked, found[k], R).length ? [k] : []));
  if (!retry.length) return;
  const again = retry.map((k) => {
    const { source, spans, originals, reserved } = parts[k].masked;
    return { ...parts[k], masked: { ...mask(source, spans, R, 1, source, reserved), originals } };
  });
  const second = await engine(again.map((p) => p.masked.text), again.map((p) => p.terms));
  retry.forEach((k, j) => {
    const translation = cased(again[j], second[j]);
    const before = missing(parts[k].masked, found[k], R).length;
    const after = missing(again[j].masked, translation, R).length;
    if (after < before) {
      [parts[k], found[k], raw[k]] = [again[j], translation, second[j]];
      tally.retried += before - after;
    }
  });
}

// `PartResults.joined`: each text's translation, its parts' translations between its own separators
// ('' for a text of whitespace only).
function joined(texts, parts, restored) {
  return texts.map((text, i) => {
    const mine = parts.flatMap((p, k) => (p.text === i ? [k] : []));
    let out = mine.length ? text.slice(0, parts[mine[0]].start) : '';
    mine.forEach((k, j) => {
      const next = j + 1 < mine.length ? parts[mine[j + 1]].start : text.length;
      out += restored[k] + text.slice(parts[k].end, next);
    });
    return out;
  });
}

// `DocumentTranslator.translate_runs`: `engine` (sentences and each one's glossary entries in, their
// translations out, in one call) translates every sentence of every text, a sentence `fits` refuses in
// parts; the spans restored, each translation goes where its sentence was. `glossary` (null: none):
// `find(text)`, the source terms of a text, and `uses(entries, translation)`, how each entry fared in the
// engine's translation (`terms_used`: met, refused or missing); the tally counts the terms found, met
// and refused, as Python's.
export async function translateTexts(texts, engine, R, segmenter, fold, fits = null, glossary = null) {
  const { parts, counts } = prepare(texts, R, segmenter, fold, fits, glossary && glossary.find);
  const tally = { ...counts, spans: 0, retried: 0, placed: 0, terms: 0, terms_met: 0, terms_refused: 0 };
  if (!parts.length) return { translations: texts.map(() => ''), ...tally };
  const raw = await engine(parts.map((p) => p.masked.text), parts.map((p) => p.terms));
  const found = raw.map((t, k) => cased(parts[k], t));
  await retried(parts, found, raw, engine, R, tally);
  const restored = parts.map((p, k) => {
    const { text, placed } = unmask(p.masked, found[k], R);
    tally.spans += p.masked.spans.length;
    tally.placed += placed;
    tally.terms += p.terms.length;
    for (const use of p.terms.length ? glossary.uses(p.terms, raw[k]) : []) {
      tally.terms_met += use.status === 'met';
      tally.terms_refused += use.status === 'refused';
    }
    return text;
  });
  return { translations: joined(texts, parts, restored), ...tally };
}
