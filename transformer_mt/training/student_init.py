"""A distilled student that starts from its teacher's weights (`distill.init_from_teacher=true`).

"Shrink and fine-tune" (Shleifer and Rush, 2020): the student is the teacher but for the depth of its
stacks. It takes the teacher's embeddings, output projection and final norms, and for each stack its layers
from the teacher's, spread evenly over the teacher's depth with the first and the last included (one layer
of several: the first, as they copy it). A stack deeper than the teacher's holds each teacher layer where it
first falls and copies of it after, whose output projections (attention's and the feed-forward's second
linear) start at zero: in a pre-norm layer, x + f(norm(x)) with f's output zero is x, so such a stack
computes what the teacher's does until training moves them. A post-norm layer has no identity (its norm
comes after the sum), so a post-norm student may only be as deep as its teacher or shallower.

The student's width, heads, feed-forward size, norms and the rest come from the teacher: `train` puts the
teacher's keys but the depths before the overrides given (jobs/replayed.py), and `check_config` refuses a
run that sets them otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import torch

from transformer_mt.config import TrainConfig
from transformer_mt.errors import ConfigError
from transformer_mt.model import Transformer
from transformer_mt.training import finetune
from transformer_mt.training.ema import WeightAverage

log = logging.getLogger(__name__)
STACKS = {"encoder": "encoder_layers", "decoder": "decoder_layers"}  # each stack and its depth's key
DEPTHS = tuple(STACKS.values())
# A layer's sublayer outputs: zero, and the pre-norm layer adds nothing to its input
OUTPUTS = ("self_attn.out_proj.", "cross_attn.out_proj.", "feed_forward.linear2.")
_LAYER = re.compile(r"^(encoder|decoder)\.layers\.")  # a stack's layer's weight


def layer_map(student: int, teacher: int) -> list[tuple[int, bool]]:
    """For each of a student stack's `student` layers: the teacher layer it starts from, and whether it
    starts as the identity (a copy after the first of that teacher layer, in a stack deeper than the
    teacher's)."""
    if student <= teacher:
        if student == 1:
            return [(0, False)]
        return [(round(i * (teacher - 1) / (student - 1)), False) for i in range(student)]
    picks = [i * teacher // student for i in range(student)]
    return [(t, i > 0 and picks[i - 1] == t) for i, t in enumerate(picks)]


def _teacher_model(state: dict[str, Any]) -> dict[str, Any]:
    """The teacher's model keys that make its weights what they are, but the depths."""
    return {k: v for k, v in finetune.decided("model", state["model_config"]).items() if k not in DEPTHS}


def problems(cfg: TrainConfig, state: dict[str, Any]) -> list[str]:
    """What keeps this run's model from starting at the teacher's weights: a model key (not a depth) set
    otherwise, or a post-norm stack deeper than the teacher's."""
    ours = dataclasses.asdict(cfg.model)
    found = [f"model.{key}={ours[key]!r} contradicts the teacher's {want!r}"
             for key, want in _teacher_model(state).items() if key in ours and ours[key] != want]
    deeper = [key for key in DEPTHS if ours[key] > state["model_config"][key]]
    if deeper and not cfg.model.norm_first:
        found += [f"model.{key}={ours[key]} is deeper than the teacher's {state['model_config'][key]}, which "
                  "a post-norm model cannot start from (its layers have no identity)" for key in deeper]
    return found


def check_config(cfg: TrainConfig, state: dict[str, Any]) -> None:
    """ConfigError in one line unless the run's model can start from the teacher's weights."""
    found = problems(cfg, state)
    if found:
        raise ConfigError(f"distill.init_from_teacher=true: {'; '.join(found)}; a student started from "
                          "its teacher keeps all but its depths: drop those settings, or "
                          "distill.init_from_teacher")


def student_weights(teacher_weights: dict[str, torch.Tensor], student_depths: dict[str, int],
                    teacher_depths: dict[str, int]) -> dict[str, torch.Tensor]:
    """The student's state dict from the teacher's (layer_map for each stack)."""
    weights = {key: value for key, value in teacher_weights.items() if not _LAYER.match(key)}
    for stack, depth in STACKS.items():
        for s, (t, identity) in enumerate(layer_map(student_depths[depth], teacher_depths[depth])):
            prefix = f"{stack}.layers.{t}."
            for key, value in teacher_weights.items():
                if key.startswith(prefix):
                    name = key[len(prefix):]
                    zero = identity and name.startswith(OUTPUTS)
                    weights[f"{stack}.layers.{s}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    return weights


def start_from_teacher(cfg: TrainConfig, model: Transformer, average: WeightAverage | None) -> None:
    """Load the student's first weights from distill.teacher's (those it translates with: its average when
    it kept one); the run's weight average starts there too."""
    path, state = finetune.load_parent(str(cfg.distill.teacher))
    check_config(cfg, state)
    ours = {depth: getattr(cfg.model, depth) for depth in DEPTHS}
    model.load_state_dict(student_weights(state["model"], ours, state["model_config"]))
    if average is not None:
        average.restore({}, model)  # (no average in the state given: it starts at the model's weights)
    taken = {stack: ", ".join(f"{t}*" if identity else str(t)
                              for t, identity in layer_map(ours[depth], state["model_config"][depth]))
             for stack, depth in STACKS.items()}
    log.info("the student starts from the teacher's weights (%s): encoder layers from the teacher's %s; "
             "decoder layers from its %s (*: as the identity)", path, taken["encoder"], taken["decoder"])
