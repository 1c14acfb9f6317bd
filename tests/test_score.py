"""`transformer-mt score`: the log-probability of given pairs against the training loss computed on its own
(a collated batch, `loss.summed_nll` without label smoothing), batching, ensembles, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import held_out_pairs
from transformer_mt.config import DecodingConfig
from transformer_mt.data import collate
from transformer_mt.decoding.scoring import score_pairs
from transformer_mt.decoding.translator import Translator, decode_ids
from transformer_mt.model import Ensemble
from transformer_mt.training.loss import summed_nll


@pytest.fixture(scope="module")
def pairs(tiny_run: Path) -> tuple[list[str], list[str]]:
    return held_out_pairs(tiny_run, 40)


def _training_loss(tiny_engine: Translator, sources: list[str], targets: list[str]) -> tuple[float, int]:
    """The summed training loss (no label smoothing) of the pairs as one collated batch, and its tokens."""
    batch = collate(tiny_engine.vocab.encode_src(sources), tiny_engine.vocab.encode_tgt(targets))
    with torch.no_grad():
        logits = tiny_engine.model.eval()(batch.src, batch.tgt_in)
    return float(summed_nll(logits, batch.tgt_out, label_smoothing=0.0)), batch.n_tgt_tokens


def test_score_equals_the_training_loss_per_token(tiny_engine: Translator, pairs) -> None:
    sources, targets = pairs
    scores = tiny_engine.score(sources, targets)
    loss, tokens = _training_loss(tiny_engine, sources, targets)
    assert sum(s.tokens for s in scores) == tokens  # target pieces + <eos>, as training counts them
    assert abs(-sum(s.log_prob for s in scores) / tokens - loss / tokens) < 1e-4
    for s, src, tgt in zip(scores[:10], sources, targets):  # and pair by pair
        own_loss, own_tokens = _training_loss(tiny_engine, [src], [tgt])
        assert s.tokens == own_tokens
        assert abs(s.mean + own_loss / own_tokens) < 1e-4


def test_batches_change_no_score_and_keep_input_order(tiny_engine: Translator, pairs) -> None:
    sources, targets = pairs
    batched = tiny_engine.score(sources, targets)
    alone = tiny_engine.score(sources, targets, batch_tokens=1)  # one pair a batch
    reversed_ = tiny_engine.score(sources[::-1], targets[::-1])[::-1]
    for a, b, c in zip(batched, alone, reversed_):
        assert a.tokens == b.tokens == c.tokens
        assert abs(a.log_prob - b.log_prob) < 1e-4 * a.tokens
        assert abs(a.log_prob - c.log_prob) < 1e-4 * a.tokens
    # The model's own greedy outputs score as the search scored them (a sum of the same log-probs).
    src_ids = tiny_engine.vocab.encode_src(sources[:8])
    greedy = decode_ids(tiny_engine.model, src_ids, DecodingConfig(beam_size=1), tiny_engine.device)
    hyps = [nbest[0] for nbest in greedy]
    rescored = score_pairs(tiny_engine.model, src_ids, [h.tokens for h in hyps], tiny_engine.device, 6000)
    assert all(abs(r.log_prob - h.score) < 1e-4 * r.tokens for r, h in zip(rescored, hyps))


def test_an_ensemble_of_one_is_the_model_and_of_two_copies_the_same(tiny_engine: Translator, pairs,
                                                                     tiny_run: Path) -> None:
    sources, targets = pairs
    alone = tiny_engine.score(sources, targets)
    model, vocab, device = tiny_engine.model, tiny_engine.vocab, tiny_engine.device
    one = Translator(Ensemble([model]), vocab, device).score(sources, targets)
    assert [s.log_prob for s in one] == [s.log_prob for s in alone]
    pair = Translator.from_checkpoint(f"{tiny_run},{tiny_run}", device="cpu", amp="off")
    two = pair.score(sources, targets)
    for a, b in zip(alone, two):
        assert abs(a.log_prob - b.log_prob) < 1e-4 * a.tokens


def test_the_command_scores_a_tsv_two_files_and_stdin_alike(tiny_engine: Translator, pairs, tiny_run: Path,
                                                            tmp_path: Path, run_cli_here) -> None:
    """The same scores from a TSV, two line files and standard input, as TSV or JSON lines. (Standard
    input as a user's shell gives it, in a process of its own; the rest in this process.)"""
    sources, targets = pairs[0][:6], pairs[1][:6]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8")
    (tmp_path / "a.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    common = [f"checkpoint={tiny_run}", "device=cpu"]
    done = run_cli_here("score", *common, f"input={tsv}", f"output={tmp_path / 'out.tsv'}")
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out.tsv").read_text(encoding="utf-8").splitlines()
    expected = tiny_engine.score(sources, targets)
    assert len(lines) == len(sources)
    for line, s in zip(lines, expected):
        total, mean = map(float, line.split("\t"))
        assert abs(total - s.log_prob) < 1e-4 * s.tokens and abs(mean - s.mean) < 1e-4
    files = run_cli_here("score", *common, f"src={tmp_path / 'a.txt'}", f"tgt={tmp_path / 'b.txt'}")
    piped = run_cli_here("score", *common, input=tsv.read_text(encoding="utf-8"))
    assert files.stdout.splitlines() == piped.stdout.splitlines() == lines
    as_json = run_cli_here("score", *common, f"input={tsv}", "output_format=json")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["tokens"] for r in rows] == [s.tokens for s in expected]
    assert all(abs(r["log_prob"] - float(line.split("\t")[0])) < 1e-5 for r, line in zip(rows, lines))


@pytest.mark.parametrize("case, says", [
    ("no_tab", "line 2 has 1 tab-separated column, expected 2"),
    ("three_columns", "line 1 has 3 tab-separated columns"),
    ("empty", "holds no pairs"),
    ("missing_checkpoint", "does not exist"),
    ("uneven_files", "has 2 lines but"),
    ("no_checkpoint", "checkpoint= is required"),
])
def test_bad_input_is_one_line_and_writes_nothing(case: str, says: str, tiny_run: Path, tmp_path: Path,
                                                  run_cli_here) -> None:
    """Each mistake ends the command with exit code 2 and one line saying it (run in this process: the
    command's own entry point, as test_the_command_scores_... runs it in a new one)."""
    texts = {"no_tab": "I am cold.\tJ'ai froid.\nno tab here\n", "three_columns": "a\tb\tc\n", "empty": ""}
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(texts.get(case, "I am cold.\tJ'ai froid.\n"), encoding="utf-8")
    out = tmp_path / "scores.tsv"
    args = [f"checkpoint={tmp_path / 'nope.pt' if case == 'missing_checkpoint' else tiny_run}",
            f"input={tsv}", f"output={out}", "device=cpu"]
    if case == "uneven_files":
        (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
        (tmp_path / "b.txt").write_text("un\n", encoding="utf-8")
        args[1] = f"src={tmp_path / 'a.txt'} tgt={tmp_path / 'b.txt'}"
        args[1:2] = args[1].split(" ")
    if case == "no_checkpoint":
        args = args[1:]
    done = run_cli_here("score", *args)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not out.exists() and done.stdout == ""
