"""The `transformer-mt` command: picks the sub-command, checks its config, and hands over to Hydra.

Hydra stays in charge of overrides, `--cfg`, `--help`, `-m` multirun and shell completion. Before it
starts, every job is composed once in this process (`composition.precheck`), so that a typo, a wrong
type or an impossible value ends the command at once with one line naming the key. Errors a user can
fix (`errors.UserError`) are one line during the run too (`_one_line`); the traceback comes with
`traceback=true` or HYDRA_FULL_ERROR=1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.config import CONFIG_DIR, SCHEMAS, validate
from transformer_mt.config.overrides import MULTIRUN_FLAGS, ensemble_checkpoints, split_flags
from transformer_mt.config.resolvers import register
from transformer_mt.config.typed import to_dataclass
from transformer_mt.errors import UserError
from transformer_mt.jobs.composition import precheck
from transformer_mt.jobs.replayed import with_resumed_overrides

COMMANDS = {
    "train": "train a model (checkpoints, TensorBoard logs and validation every epoch)",
    "evaluate": "score a checkpoint: BLEU, chrF, CER, WER and decoding speed",
    "translate": "translate text from the command line, stdin or a file",
    "export": "export a checkpoint to CTranslate2 (int8/float16 ...) for fast inference",
    "serve": "serve a model over HTTP: a JSON API with cross-request batching, and a page",
    "score": "the model's log-probability of given translation pairs (to filter or rerank them)",
}
USAGE = """usage: transformer-mt <command> [key=value ...] [hydra flags]

commands:
{commands}

examples:
  transformer-mt train debug=tiny                                 # a run of seconds, to try things
  transformer-mt train model=tiny dataset.max_pairs=3000 training.epochs=2
  transformer-mt train -m model=tiny,small training.lr=5e-4,1e-3   # summary.md at the sweep root
  transformer-mt train -m sweep=optuna hydra.sweeper.n_trials=20  # Optuna search ('.[sweep]' extra)
  torchrun --nproc_per_node=2 -m transformer_mt train             # one process per GPU (DDP)
  transformer-mt translate checkpoint=saved_weights/<run> text="He is sleeping."
  echo "I am cold." | transformer-mt translate checkpoint=saved_weights/<run>
  transformer-mt export checkpoint=saved_weights/<run> quantization=int8
  transformer-mt serve checkpoint=saved_weights/<run> port=8000   # API + page at http://127.0.0.1:8000/
  transformer-mt score checkpoint=saved_weights/<run> input=pairs.tsv  # sum<TAB>mean log-prob a pair
  transformer-mt train --cfg job        # print the composed config
  transformer-mt train --help           # config groups and every key

Errors are one line; set HYDRA_FULL_ERROR=1 (or traceback=true) for the full traceback."""


@dataclass
class Extras:
    """What the command line hands a job besides its config."""

    text: str | None = None  # translate: text= taken verbatim, out of Hydra's override grammar


def _take_verbatim_text(args: list[str], extras: Extras) -> list[str]:
    """`text=...` may hold commas, quotes and `=`: take it out before Hydra's grammar sees it."""
    kept: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            extras.text = " ".join(args[i + 1:])
            break
        if arg.startswith("text="):
            extras.text = arg[len("text="):]
        else:
            kept.append(arg)
    return kept


def _job(command: str) -> Callable[..., Any]:
    """Import the job lazily: `--help` and completion stay fast."""
    if command == "train":
        from transformer_mt.jobs.train import train
        return train
    if command == "evaluate":
        from transformer_mt.jobs.evaluate import evaluate
        return evaluate
    if command == "export":
        from transformer_mt.jobs.export import export
        return export
    if command == "serve":
        from transformer_mt.jobs.serve import serve
        return serve
    if command == "score":
        from transformer_mt.jobs.score import score
        return score
    from transformer_mt.jobs.translate import translate
    return translate


def _one_line(ex: UserError, traceback: bool) -> int:
    """Print a UserError as `error: <message>` and return the exit code, 2; with `traceback=true` or
    HYDRA_FULL_ERROR=1 raise it instead, traceback and all."""
    if traceback or os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise ex
    print(f"error: {ex}", file=sys.stderr)
    return 2


def _asks_traceback(overrides: list[str]) -> bool:
    """`traceback=true` among the overrides (the last one given wins), read before anything is composed."""
    values = [o.partition("=")[2].lower() for o in overrides if o.startswith("traceback=")]
    return bool(values) and values[-1] in ("true", "yes", "on", "1")


def run_command(command: str, cfg: DictConfig, extras: Extras) -> Any:
    """The Hydra task function: typed config in, the job's result out (a sweep's objective)."""
    typed = to_dataclass(cfg, SCHEMAS[command])
    try:
        if command == "translate" and extras.text is not None:
            typed.text = extras.text  # before validate: its rules read it too
        validate(typed)
        return _job(command)(typed)
    except UserError as ex:
        sys.exit(_one_line(ex, typed.traceback))


def _hydra_main(command: str, extras: Extras) -> Callable[[], Any]:
    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=command)
    def task(cfg: DictConfig) -> Any:
        return run_command(command, cfg, extras)

    return task


def _completion(args: list[str]) -> int:
    """Shell completion: the shell calls us without the sub-command, so read it from COMP_LINE."""
    words = os.environ.get("COMP_LINE", "").split()
    if any(a.startswith("query") for a in args) and len(words) >= 2 and words[1] in COMMANDS:
        os.environ["COMP_LINE"] = " ".join([words[0], *words[2:]]) + (
            " " if os.environ.get("COMP_LINE", "").endswith(" ") else "")
        command = words[1]
    elif any(a.startswith("query") for a in args):
        print(" ".join(COMMANDS))
        return 0
    else:
        command = "train"
    sys.argv = ["transformer-mt", *args]
    _hydra_main(command, Extras())()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of `python -m transformer_mt`."""
    args = list(sys.argv[1:] if argv is None else argv)
    register()
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE.format(commands="\n".join(f"  {k:<10} {v}" for k, v in COMMANDS.items())))
        return 0
    if args[0] in ("-sc", "--shell-completion"):
        return _completion(args)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: unknown command '{command}'; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    extras = Extras()
    if command == "translate":
        rest = _take_verbatim_text(rest, extras)
    rest = ensemble_checkpoints(command, rest)
    try:
        world = _torchrun_world(command, rest)
        if command == "train":
            rest = with_resumed_overrides(rest)
        precheck(command, rest)
    except UserError as ex:
        return _one_line(ex, _asks_traceback(rest))
    if world is None:
        sys.argv = ["transformer-mt", *rest]
        _hydra_main(command, extras)()
        return 0
    from transformer_mt.training import distributed

    try:
        sys.argv = ["transformer-mt", *_join_process_group(world, rest)]
        _hydra_main(command, extras)()
        # The ranks leave together: rank 0 still writes the shortlist and calibrates after training, and a
        # rank that tore down its gloo group meanwhile could abort at exit. (Where a rank fails, torchrun
        # stops the others.)
        distributed.barrier()
    finally:
        distributed.shutdown()
    return 0


def _torchrun_world(command: str, args: list[str]) -> Any:
    """The `distributed.World` torchrun describes when it started several processes, else None.

    Under torchrun only `train` runs, and as one job: a sweep's jobs are launched by Hydra instead. A
    plain run doesn't import torch here, so `--help` and completion stay fast.
    """
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return None
    from transformer_mt.training import distributed

    world = distributed.env_world()
    if not world.distributed:
        return None
    if command != "train":
        raise UserError(f"{command} runs in one process; start it without torchrun")
    if MULTIRUN_FLAGS & set(split_flags(args)[0]):
        raise UserError("torchrun runs one training job on several processes; run a sweep (-m) without "
                        "torchrun, and its launcher starts the jobs")
    return world


def _join_process_group(world: Any, args: list[str]) -> list[str]:
    """Join the other ranks and take rank 0's start time; ranks > 0 leave the run directory to rank 0.

    They log warnings only and don't write Hydra's `.hydra/` files into the directory they share.
    """
    from transformer_mt.training import distributed

    distributed.init(world)
    distributed.share_start_time(world)
    if world.is_main:
        return args
    return [*args, "hydra.output_subdir=null", "hydra.job_logging.root.level=WARNING"]


if __name__ == "__main__":
    sys.exit(main())
