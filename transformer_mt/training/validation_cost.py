"""What one validation costs, per validated pair, timed as validation runs it: its loss, its decoding and
its scores. The plan (plan/) sizes validation's sample and interval with it."""

from __future__ import annotations

import dataclasses
import time

import torch

from transformer_mt.checkpoints.store import build_model
from transformer_mt.config import DecodingConfig, ModelConfig, SearchConfig
from transformer_mt.data import EncodedSplit, PreparedData
from transformer_mt.decoding.decode import decode_ids, decoding_batches
from transformer_mt.decoding.metrics import score
from transformer_mt.model import Transformer
from transformer_mt.runtime.rng import rng_state, set_rng_state
from transformer_mt.training.throughput import synchronize
from transformer_mt.training.validation import validation_loss

DECODED = 32  # validation sentences decoded first to time one (more, where there is time)
UNTIMED = 2  # sentences (and pairs of the loss) run once before timing: a GPU's first calls set up kernels
LOSS_PAIRS = 200  # validation pairs whose loss is timed


def validation_seconds(model_cfg: ModelConfig, data: PreparedData, decoding: SearchConfig, batch_tokens: int,
                       device: torch.device, amp: torch.dtype | None, decode_amp: torch.dtype | None,
                       deadline: float, sentences: int) -> float:
    """Seconds per pair of validation's sample (at most its first `sentences`): its loss and its scores,
    timed on up to LOSS_PAIRS pairs, and its decoding (sentence_seconds), of an untrained `model_cfg`
    (random generators left as they were); times the directions validated, in a model of several
    target languages (each has a sample of its own)."""
    valid = data.valid
    timed = valid.subset(range(min(LOSS_PAIRS, len(valid))))
    state = rng_state()
    try:
        model = build_model(model_cfg, data.vocab).to(device).eval()
        validation_loss(model, valid.subset(range(min(UNTIMED, len(valid)))), batch_tokens, device,
                        amp)
        synchronize(device)
        start = time.perf_counter()
        validation_loss(model, timed, batch_tokens, device, amp)
        synchronize(device)
        loss_each = (time.perf_counter() - start) / max(len(timed), 1)
        decoding_each = sentence_seconds(model, data, decoding, device, decode_amp, deadline, sentences)
        return (loss_each + scoring_seconds(timed) + decoding_each) * max(len(data.directions), 1)
    finally:
        set_rng_state(state)


def sentence_seconds(model: Transformer, data: PreparedData, decoding: SearchConfig, device: torch.device,
                     decode_amp: torch.dtype | None, deadline: float, sentences: int) -> float:
    """Seconds per sentence of validation's decoding: the padded tokens of its batches (a batch decodes
    each row for its longest source) at what one costs in the batch of validation's median sentence,
    whose rows share each step as validation's do (fewer rows cost more per token). UNTIMED of its
    rows are decoded first, then DECODED timed, then as many more as `deadline` leaves time for. An
    untrained model never ends a sentence, so each is decoded to its source's length, about what a
    trained one writes."""
    src = data.valid.src_ids[:sentences]
    as_long = DecodingConfig(**{**dataclasses.asdict(decoding), "max_len_a": 1.0, "max_len_b": 1})
    batches = decoding_batches([len(s) for s in src], as_long, device)
    order = [i for batch in batches for i in batch]
    batch = next(b for b in batches if order[len(order) // 2] in b)

    def padded(rows: list[int]) -> int:
        return len(rows) * (max(len(src[i]) for i in rows) + 1)

    def seconds_per_token(rows: int) -> float:
        middle = batch[(len(batch) - rows) // 2:][:rows]
        start = time.perf_counter()
        decode_ids(model, [src[i] for i in middle], as_long, device, amp=decode_amp)
        synchronize(device)
        return (time.perf_counter() - start) / padded(middle)

    seconds_per_token(min(UNTIMED, len(batch)))  # (untimed)
    per_token = seconds_per_token(min(DECODED, len(batch)))
    row_s = per_token * padded(batch) / len(batch)
    more = min(len(batch), int((deadline - time.perf_counter()) / row_s))
    if more > DECODED:
        per_token = seconds_per_token(more)
    return per_token * sum(padded(b) for b in batches) / len(src)


def scoring_seconds(pairs: EncodedSplit) -> float:
    """Seconds per pair of validation's scores (BLEU, chrF, CER, WER), timed with each pair's source as its
    translation: a text about as long as a translation, unlike its reference as an untrained model's
    output is (scoring identical texts would take edit distances' shortcuts)."""
    if not len(pairs) or pairs.src_text is None or pairs.tgt_text is None:
        return 0.0
    start = time.perf_counter()
    score(pairs.src_text, pairs.tgt_text)
    return (time.perf_counter() - start) / len(pairs)
