"""transformer-mt: a from-scratch Transformer for machine translation, driven by Hydra configs.

The Python API is the command line's, in this process:

    >>> import transformer_mt as tmt
    >>> tmt.train(["debug=tiny", "checkpoint.dir=runs/try"])       # overrides, as on the command line
    >>> tmt.evaluate(["checkpoint=runs/try", "decoding.beam_size=5"])
    >>> cfg = tmt.compose("translate", ["checkpoint=runs/try"])     # or a typed config, to edit first
    >>> cfg.text = "He is sleeping."
    >>> tmt.translate(cfg)
    >>> engine = tmt.Translator.from_checkpoint("runs/try")         # load once, translate many
    >>> engine.translate(["I am cold.", "Where is the station?"], beam_size=5)
    >>> engine.score(["I am cold."], ["J'ai froid."])[0].mean       # log-probability per token

Nothing heavy is imported until it is used, so `transformer-mt --help` stays fast. What each module
of the package owns: docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_mt.decoding.translator import Translator

__version__ = "0.1.0"
__all__ = ["Translator", "compose", "evaluate", "export", "score", "train", "translate"]


def compose(command: str, overrides: Sequence[str] = ()) -> Any:
    """The typed, validated config of `transformer-mt <command> <overrides>`."""
    from transformer_mt.jobs.composition import compose as compose_config

    return compose_config(command, overrides)


def _typed(command: str, config: Any) -> Any:
    """A config given as overrides is composed; a typed one is validated."""
    if isinstance(config, (list, tuple)):
        return compose(command, config)
    from transformer_mt.config import validate

    validate(config)
    return config


def train(config: Any = ()) -> float:
    """`transformer-mt train`: overrides or a TrainConfig in, the best validation metric out; with
    `resume=<run>` among the overrides, the run's own overrides are replayed first, as on the command line."""
    from transformer_mt.jobs.replayed import with_resumed_overrides
    from transformer_mt.jobs.train import train as job

    if isinstance(config, (list, tuple)):
        config = with_resumed_overrides(config)
    return job(_typed("train", config))


def evaluate(config: Any = ()) -> float:
    """`transformer-mt evaluate`: overrides or an EvaluateConfig in, BLEU out."""
    from transformer_mt.jobs.evaluate import evaluate as job

    return job(_typed("evaluate", config))


def translate(config: Any = ()) -> None:
    """`transformer-mt translate`: overrides or a TranslateConfig (set its `text` for free text)."""
    from transformer_mt.jobs.translate import translate as job

    job(_typed("translate", config))


def export(config: Any = ()) -> Any:
    """`transformer-mt export`: overrides or an ExportConfig in, the model directory out."""
    from transformer_mt.jobs.export import export as job

    return job(_typed("export", config))


def score(config: Any = ()) -> list[Any]:
    """`transformer-mt score`: overrides or a ScoreConfig in, each pair's `PairScore` out (also written)."""
    from transformer_mt.jobs.score import score as job

    return job(_typed("score", config))


def __getattr__(name: str) -> Any:
    """`transformer_mt.Translator`, imported on first use."""
    if name == "Translator":
        from transformer_mt.decoding.translator import Translator

        return Translator
    raise AttributeError(f"module 'transformer_mt' has no attribute {name!r}")
