"""How fast models of several shapes translate on this machine, before any is trained: sentences/s of the
run's search (beam 5 by default) over validation sources, each output forced to its reference's tokens.
An untrained model seldom writes <eos> and would decode every sentence to the length limit; forced to
its reference, each writes as many tokens as a trained one would, through the same search (every beam of
a sentence is computed, forced or not), batches and precision. Forcing costs a little at each step, the
same for every shape: the speed-ups it shows between shapes are, if anything, smaller than a trained
model's. The plan (plan/) chooses a decoder depth with it (`training.decode_speedup`), and
scripts/benchmark_shapes.py compares shapes with it.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from transformer_mt.checkpoints.store import build_model
from transformer_mt.config import DecodingConfig, ModelConfig, SearchConfig
from transformer_mt.data import EncodedSplit, PreparedData
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.model import Transformer
from transformer_mt.runtime.rng import rng_state, set_rng_state
from transformer_mt.training.throughput import relative_flops, synchronize

SENTENCES = 100  # validation sources each shape decodes in decoder_speeds


def layers(c: ModelConfig) -> str:
    """A shape's name by its layers: `6+1` is 6 encoder layers and 1 decoder layer."""
    return f"{c.encoder_layers}+{c.decoder_layers}"


def shallow_decoders(balanced: ModelConfig, data: PreparedData, batch_tokens: int) -> dict[str, ModelConfig]:
    """The balanced shape, then one with each shallower decoder (deepest first), by `layers`: each keeps its
    width, its encoder as deep as brings its training FLOPs per target token nearest the balanced shape's,
    so that a budget trains each on about as many tokens (as Kasai et al., 2021, moved the layers)."""
    shapes = {layers(balanced): balanced}
    for decoder in range(balanced.decoder_layers - 1, 0, -1):
        depths = range(balanced.encoder_layers, balanced.encoder_layers + 2 * balanced.decoder_layers)
        deeper = [dataclasses.replace(balanced, encoder_layers=n, decoder_layers=decoder) for n in depths]
        cost = relative_flops(data, {0: balanced, **{i + 1: c for i, c in enumerate(deeper)}}, batch_tokens)
        nearest = deeper[min(range(len(deeper)), key=lambda i: abs(cost[i + 1] - 1))]
        shapes[layers(nearest)] = nearest
    return shapes


def forced_seconds(model: Transformer, pairs: EncodedSplit, search: SearchConfig, device: torch.device,
                   amp: torch.dtype | None) -> float:
    """Seconds `search` takes over the sources of `pairs`, each output forced to its reference's tokens and
    ended after them (the length limit set to the reference's length; at most the model's positions)."""
    forced = DecodingConfig(**{**dataclasses.asdict(search), "max_len_a": 0.0, "max_len_b": 1})
    sources = [s.tolist() for s in pairs.src_ids]
    longest = model.config.max_positions - 1
    references = [t.tolist()[:longest] for t in pairs.tgt_ids]  # (an empty one: one token, then <eos>)
    synchronize(device)
    start = time.perf_counter()
    decode_ids(model, sources, forced, device, amp=amp, prefixes=references)
    synchronize(device)
    return time.perf_counter() - start


def untrained(shapes: dict[str, ModelConfig], vocab: Vocabulary, device: torch.device
              ) -> dict[str, Transformer]:
    """A model of each shape with fresh random weights, in eval mode (random generators left as they were)."""
    state = rng_state()
    try:
        return {name: build_model(c, vocab).to(device).eval() for name, c in shapes.items()}
    finally:
        set_rng_state(state)


def forced_speeds(models: dict[str, Transformer], pairs: EncodedSplit, search: SearchConfig,
                  device: torch.device, amp: torch.dtype | None, rounds: int = 2) -> dict[str, float]:
    """Sentences/s of each model over `pairs` (forced_seconds), the best of `rounds` rounds that alternate
    the models, so that a busy neighbour slows them alike."""
    warm_up = pairs.subset(range(min(2, len(pairs))))
    for model in models.values():  # allocator, thread pool, autocast's weight casts (the kernels of each
        # batch shape are built in the first round: the best round counts)
        forced_seconds(model, warm_up, search, device, amp)
    best = dict.fromkeys(models, math.inf)
    for _ in range(rounds):
        for name, model in models.items():
            best[name] = min(best[name], forced_seconds(model, pairs, search, device, amp))
    return {name: len(pairs) / seconds for name, seconds in best.items()}


def decoder_speeds(balanced: ModelConfig, data: PreparedData, search: SearchConfig, device: torch.device,
                   amp: torch.dtype | None, batch_tokens: int
                   ) -> tuple[dict[str, ModelConfig], dict[str, float]]:
    """The shallow_decoders of a balanced shape, and the sentences/s of each, untrained, over the first
    SENTENCES validation pairs (forced_speeds): what `training.decode_speedup` chooses by."""
    shapes = shallow_decoders(balanced, data, batch_tokens)
    pairs = data.valid.subset(range(min(SENTENCES, len(data.valid))))
    return shapes, forced_speeds(untrained(shapes, data.vocab, device), pairs, search, device, amp)
