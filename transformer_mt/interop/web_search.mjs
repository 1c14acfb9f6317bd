// Greedy search with target terms for the page of `export format=web`: a port of Python's
// `bank_greedy_search` (decoding/beam.py, decoding/constrained.py, decoding/constraints.py), step for
// step, so that the page writes the tokens PyTorch writes. Transformers.js's `generate` cannot hold
// several hypotheses of one sentence, so this loop feeds the model's decoder itself (`onnxDecoder`).
//
// Greedy with terms keeps the best hypothesis of each bank (how many of the terms' tokens it has written):
// K = C + 1 rows for a sentence whose terms take C tokens at least. Each step: <eos> closed while a term
// is unmet; the candidates are the best 2K continuations, each row's own best token and its constraint
// tokens; one whose terms can no longer fit before the length limit is dropped; the best of each bank
// goes on, and a row that writes <eos> with its terms met ends. The state of a row is, per variant of a
// term, how much of it was just written (KMP progress), which terms are met, whether its last token ends
// inside a word and whether it just finished a term: with the vocabulary's word edges (`wordEdges`) a
// term is written as whole words, as `WordEdges` makes Python write it.

// `constraints._automaton`: KMP transitions of one variant, [k][p] = progress after reading variant[p]
// in progress k.
function automaton(v) {
  const fail = new Array(v.length).fill(0);
  for (let i = 1; i < v.length; i++) {
    let k = fail[i - 1];
    while (k && v[i] !== v[k]) k = fail[k - 1];
    fail[i] = k + (v[i] === v[k] ? 1 : 0);
  }
  return v.map((_, k) => v.map((token) => {
    let j = k;
    while (j && v[j] !== token) j = fail[j - 1];
    return j + (v[j] === token ? 1 : 0);
  }));
}

const shortest = (term) => Math.min(...term.map((v) => v.length));

// `WordEdges` as the export writes them (two bit sets, base64, a bit a token): `glues[v]`, token v's text
// continues a word written before it; `ends[v]`, its text ends inside a word.
export function wordEdges({ glues, ends }) {
  const bits = (b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    return (v) => (bytes[v >> 3] >> (v & 7)) & 1;
  };
  return { glues: bits(glues), ends: bits(ends) };
}

// `constraints.fit_terms`: which terms (each a list of variants, in order) fit in `room` output tokens,
// and why each other one does not (as Python words it).
export function fitTerms(terms, room) {
  const kept = [];
  const refused = [];
  let used = 0;
  terms.forEach((term, i) => {
    if (!term.length) {
      refused.push({ index: i, reason: "this model's vocabulary cannot write it" });
    } else if (used + shortest(term) > room) {
      refused.push({ index: i, reason: `the terms of this sentence need ${used + shortest(term)} target `
        + `tokens; this model writes at most ${room} here` });
    } else {
      kept.push(i);
      used += shortest(term);
    }
  });
  return { kept, refused };
}

// `constraints.sentence_terms`: the terms one sentence is searched with, from its entries ({target,
// variants} each): each target term once, as many as `room` output tokens hold (`fitTerms`); and the
// entries refused, with why.
export function sentenceTerms(entries, room) {
  const targets = [...new Map(entries.map((e) => [e.target, e.variants])).entries()];
  const { kept, refused } = fitTerms(targets.map(([, v]) => v), room);
  const why = new Map(refused.map((r) => [targets[r.index][0], r.reason]));
  return { terms: kept.map((k) => targets[k][1]),
           refused: entries.filter((e) => why.has(e.target)).map((e) => ({ ...e, reason: why.get(e.target) })) };
}

// `Constraints.build` for one sentence: its distinct terms, their variants, each variant's automaton and
// whether its first token glues to a word before it (`edges`: `wordEdges`, or null for none).
export function constraintsOf(terms, edges = null) {
  const distinct = [...new Map(terms.map((t) => [JSON.stringify(t), t])).values()];
  const variants = distinct.flatMap((t, j) => t.map((seq) => ({ seq, term: j, dfa: automaton(seq),
                                                                glued: edges !== null && !!edges.glues(seq[0]) })));
  const minlen = distinct.map(shortest);
  return { variants, minlen, cmin: minlen.reduce((a, b) => a + b, 0), edges,
           longest: Math.max(1, ...variants.map((v) => v.seq.length)) };
}

const start = (c) => ({ prog: c.variants.map(() => 0), met: c.minlen.map(() => false), inWord: false,
                        fresh: false });

// `TermState.advance`: the state after writing `token`; a glued variant does not start inside a word.
function advance(c, state, token) {
  const met = [...state.met];
  let fresh = false;
  const prog = c.variants.map((v, m) => {
    const at = v.seq.indexOf(token);
    let next = at >= 0 ? v.dfa[state.prog[m]][at] : 0;
    if (next === 1 && v.glued && state.inWord) next = 0;
    if (next !== v.seq.length) return next;
    met[v.term] = true;
    fresh = true;
    return 0;
  });
  return { prog, met, inWord: c.edges ? !!c.edges.ends(token) : state.inWord, fresh };
}

// `TermState.need`: tokens one way of completing the unmet terms takes (0 exactly when all are met).
function need(c, state) {
  let total = 0;
  c.minlen.forEach((n, j) => { if (!state.met[j]) total += n; });
  let credit = 0;
  c.variants.forEach((v, m) => {
    if (!state.met[v.term]) credit = Math.max(credit, c.minlen[v.term] - (v.seq.length - state.prog[m]));
  });
  return total - credit;
}

// `TermState.least`: tokens any completion takes at least.
function least(c, state) {
  const fewest = c.minlen.map(() => c.longest);
  c.variants.forEach((v, m) => { fewest[v.term] = Math.min(fewest[v.term], v.seq.length - state.prog[m]); });
  return Math.max(0, ...fewest.map((f, j) => (state.met[j] ? 0 : f)));
}

// `_term_tokens`: a row's constraint tokens, [token, real] each: per variant of an unmet term its next
// token, then per variant its first token (real when the variant is started); never a first token that
// would glue to the word before.
function termTokens(c, state) {
  const open = c.variants.map((v) => !state.met[v.term]);
  const startable = c.variants.map((v, m) => open[m] && !(v.glued && state.inWord));
  return [...c.variants.map((v, m) => [v.seq[state.prog[m]], state.prog[m] > 0 ? open[m] : startable[m]]),
          ...c.variants.map((v, m) => [v.seq[0], startable[m] && state.prog[m] > 0])];
}

// `step_log_probs`: float32 logits to log-probs (rounded to float32, as PyTorch keeps them), `banned`
// tokens impossible, only <eos> (at its own log-prob) once the sentence is at its length limit.
export function logProbs(logits, banned, eos, atMax) {
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  let sum = 0;
  for (const x of logits) sum += Math.exp(x - max);
  const shift = max + Math.log(sum);
  const out = Float64Array.from(logits, (x) => Math.fround(x - shift));
  for (const b of banned) out[b] = -Infinity;
  if (atMax) {
    const keep = out[eos];
    out.fill(-Infinity);
    out[eos] = keep;
  }
  return out;
}

// Indices 0..n-1 sorted by `key` (smallest first), ties in index order (PyTorch's stable sorts).
const argsort = (n, key) => Array.from({ length: n }, (_, i) => i).sort((a, b) => key(a) - key(b) || a - b);
const byValue = (x) => (i, j) => (x[j] > x[i]) - (x[j] < x[i]) || i - j;  // largest first, then in order

// The indices of the n largest values of `row`, largest first (an earlier index first among equals).
function largest(row, n) {
  const top = [];
  row.forEach((x, i) => {
    if (top.length === n && !(x > row[top[n - 1]])) return;
    let p = top.length;
    while (p > 0 && x > row[top[p - 1]]) p--;
    top.splice(p, 0, i);
    if (top.length > n) top.pop();
  });
  return top;
}

// `_top_candidates`: the best 2K continuations of the K rows, best first: [score, token, row].
function topCandidates(logp, scores, K) {
  const n = Math.min(2 * K, logp[0].length);
  const all = logp.flatMap((row, r) => largest(row, n).map((tok) => [scores[r] + row[tok], tok, r]));
  const sums = all.map(([s]) => s);
  return argsort(all.length, () => 0).sort(byValue(sums)).slice(0, n).map((i) => all[i]);
}

// `_stripe` with per_bank: the candidates in bank turns, the fullest bank's best first; only each bank's
// best is live. Returns the order and which are live.
function stripe(score, bank, eos, nBanks) {
  const Q = score.length;
  const byScore = argsort(Q, () => 0).sort(byValue(score));
  const order = byScore.map((i, p) => [i, p]).sort(([i, p], [j, q]) => bank[j] - bank[i] || p - q)
    .map(([i]) => i);
  const live = order.map((i, p) => Number.isFinite(score[i]) && (p === 0 || bank[order[p - 1]] !== bank[i]));
  const key = order.map((i, p) => (live[p] ? nBanks - 1 - bank[i] : Q * nBanks + (eos[i] ? 1 : 0)));
  const turns = argsort(Q, (p) => key[p]);
  return { order: turns.map((p) => order[p]), live: turns.map((p) => live[p]) };
}

// `TermSearch.candidates` with per_bank: the step's 2K candidates, [score, token, row, state] each.
function candidates(c, logp, scores, states, K, eos, room, nBanks) {
  const V = logp[0].length;
  const cands = topCandidates(logp, scores, K);
  states.forEach((state, r) => {
    let best = 0;
    logp[r].forEach((x, i) => { if (x > logp[r][best]) best = i; });
    const own = [[best, true], ...termTokens(c, state).map(([tok, real]) => [real ? tok : best, real])];
    for (const [tok, real] of own) cands.push([real ? scores[r] + logp[r][tok] : -Infinity, tok, r]);
  });
  const seen = new Set();  // `_drop_duplicates`: a repeat of an earlier (row, token) is dropped
  for (const cand of cands) {
    const key = cand[2] * V + cand[1];
    if (seen.has(key)) cand[0] = -Infinity;
    seen.add(key);
  }
  const next = cands.map(([, tok, row]) => advance(c, states[row], tok));
  const isEos = cands.map(([, tok]) => tok === eos);
  const score = cands.map(([s], i) => (!isEos[i] && least(c, next[i]) > room ? -Infinity : s));
  const bank = next.map((s) => c.cmin - need(c, s));
  const { order, live } = stripe(score, bank, isEos, nBanks);
  return order.slice(0, Math.min(2 * K, V)).map((i, p) => [live[p] ? score[i] : -Infinity, cands[i][1],
                                                             cands[i][2], next[i]]);
}

// `bank_greedy_search` of one sentence: the tokens (without <bos> and <eos>) and score (the sum of their
// log-probs) of its best output holding every term, or null when none ends (the search is built so that
// one always does). `decoder.step(rows, tokens)`: the logits (one Float32Array a row) after each row
// continues row `rows[i]` of the previous call with `tokens[i]`; the first call, (null, null), reads
// <bos> in one row. `terms`: the terms `sentenceTerms` kept, each its variants; `maxLen`: the sentence's
// length limit (`max_output_length`), raised here to the terms' tokens (`constrained.limits`: and a token
// a term for a space before it, within the model's `positions`); `edges`: `wordEdges` (null: none).
export async function bankGreedy(decoder, terms, { maxLen, eos, banned, positions, edges = null }) {
  const c = constraintsOf(terms, edges);
  const K = c.cmin + 1;
  const limit = Math.max(maxLen, Math.min(c.cmin + (edges ? c.minlen.length : 0), positions - 1));
  let scores = Array.from({ length: K }, (_, r) => (r ? -Infinity : 0));
  let states = scores.map(() => start(c));
  let prefixes = scores.map(() => []);
  let rows = null;
  let tokens = null;
  const finished = [];
  for (let t = 0; ; t++) {
    const logits = await decoder.step(rows, tokens);
    const logp = (t ? logits : scores.map(() => logits[0])).map((l) => logProbs(l, banned, eos, t >= limit));
    states.forEach((state, r) => {  // `close_eos`, and no token glued to a term just written
      if (need(c, state) > 0) logp[r][eos] = -Infinity;
      if (edges && state.fresh) logp[r].forEach((_, v) => { if (edges.glues(v)) logp[r][v] = -Infinity; });
    });
    const cands = candidates(c, logp, scores, states, K, eos, limit - t - 1, K);
    cands.slice(0, K).forEach(([score, tok, row]) => {  // `_finalise`
      if (tok === eos && Number.isFinite(score)) finished.push({ tokens: prefixes[row], score });
    });
    const pick = argsort(cands.length, (i) => (cands[i][1] === eos) * cands.length + i).slice(0, K);
    scores = pick.map((i) => cands[i][0]);
    states = pick.map((i) => cands[i][3]);
    const best = Math.max(...scores);
    const top = finished.reduce((a, h) => (a === null || h.score > a.score ? h : a), null);
    if (finished.length >= K || t + 1 > limit || (top !== null && best <= top.score)) return top;
    prefixes = pick.map((i) => [...prefixes[cands[i][2]], cands[i][1]]);
    rows = pick.map((i) => (t ? cands[i][2] : 0));  // at t = 0 every row is the one row read
    tokens = pick.map((i) => cands[i][1]);
  }
}

// Rows of a (rows, ...) tensor's data: row `rows[i]` of `tensor` as row i (a typed-array copy).
function gathered(Tensor, tensor, rows) {
  const size = tensor.data.length / tensor.dims[0];
  const data = new tensor.data.constructor(rows.length * size);
  rows.forEach((r, i) => data.set(tensor.data.subarray(r * size, (r + 1) * size), i * size));
  return new Tensor(tensor.type, data, [rows.length, ...tensor.dims.slice(1)]);
}

// `bankGreedy`'s decoder over a Transformers.js seq2seq model (4.3.1): the encoder once, then the
// merged decoder graph a step at a time with its self-attention keys and values gathered for the rows
// that go on, and the cross-attention ones of the first step (they depend on the source only); with
// cache=false each step feeds every row's whole prefix instead (the slow reference).
export async function onnxDecoder(model, Tensor, inputs, bos, cache = true) {
  const memory = await model._encode_input('model', inputs, 'last_hidden_state');
  const copies = (tensor, n) => gathered(Tensor, tensor, new Array(n).fill(0));
  const ids = (rows) => new Tensor('int64', BigInt64Array.from(rows.flat(), BigInt),
                                   [rows.length, rows[0].length]);
  const lastLogits = (logits) => {
    const [n, T, V] = logits.dims;
    return Array.from({ length: n }, (_, r) => logits.data.subarray((r * T + T - 1) * V, (r * T + T) * V));
  };
  let wide = null;
  const widened = (n) => {  // the source's rows (and the cross-attention's) for n rows, made once
    if (wide === null || n !== wide.n) {
      wide = { n, encoder_outputs: copies(memory, n), attention_mask: copies(inputs.attention_mask, n),
               cross: Object.fromEntries(Object.entries(cross).map(([k, t]) => [k, copies(t, n)])) };
    }
    return wide;
  };
  let cross = {};  // the first step's cross-attention keys and values (one row)
  let past = {};  // the self-attention keys and values of the last call's rows
  let prefixes = [[bos]];
  return {
    async step(rows, tokens) {
      const { encoder_outputs, attention_mask, cross: shared } = widened(rows ? rows.length : 1);
      const feed = { encoder_outputs, attention_mask };
      if (!cache) {
        prefixes = rows ? rows.map((r, i) => [...prefixes[r], tokens[i]]) : prefixes;
        return lastLogits((await model.forward({ ...feed, decoder_input_ids: ids(prefixes) })).logits);
      }
      feed.decoder_input_ids = ids(rows ? tokens.map((t) => [t]) : [[bos]]);
      if (rows) {
        feed.past_key_values = { ...shared };
        for (const [name, t] of Object.entries(past)) feed.past_key_values[name] = gathered(Tensor, t, rows);
      }
      const out = await model.forward(feed);
      past = {};
      for (const [name, t] of Object.entries(out)) {
        if (!name.startsWith('present')) continue;
        const key = name.replace('present', 'past_key_values');
        if (!name.includes('encoder')) past[key] = t;
        else if (!rows) cross[key] = t;
      }
      if (!rows) wide = null;  // made again with the cross-attention's rows
      return lastLogits(out.logits);
    },
  };
}
