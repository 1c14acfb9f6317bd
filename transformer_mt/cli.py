"""The `transformer-mt` command: picks the sub-command's config, checks it, and hands over to Hydra.

Hydra stays in charge of overrides, `--cfg`, `--help`, `-m` multirun and shell completion. Before it
starts, we compose the same config once ourselves so that a typo, a wrong type or an impossible value
ends the run at once with one line naming the key, instead of a multi-line report or a traceback.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep
from omegaconf import DictConfig, OmegaConf

from transformer_mt.config import (
    CONFIG_DIR,
    SCHEMAS,
    ConfigError,
    register_schemas,
    to_dataclass,
    validate,
)

COMMANDS = {
    "train": "train a model (checkpoints, TensorBoard logs and validation every epoch)",
    "evaluate": "score a checkpoint: BLEU, chrF, CER, WER and decoding speed",
    "translate": "translate text from the command line, stdin or a file",
    "export": "export a checkpoint to CTranslate2 (int8/float16 ...) for fast inference",
}
USAGE = """usage: transformer-mt <command> [key=value ...] [hydra flags]

commands:
{commands}

examples:
  transformer-mt train model=tiny dataset.max_pairs=3000 training.epochs=2
  transformer-mt train -m model=tiny,small training.lr=5e-4,1e-3   # summary.md at the sweep root
  transformer-mt train -m sweep=optuna hydra.sweeper.n_trials=20  # Optuna search ('.[sweep]' extra)
  torchrun --nproc_per_node=2 -m transformer_mt train             # one process per GPU (DDP)
  transformer-mt translate checkpoint=saved_weights/<run> text="He is sleeping."
  echo "I am cold." | transformer-mt translate checkpoint=saved_weights/<run>
  transformer-mt export checkpoint=saved_weights/<run> quantization=int8
  transformer-mt train --cfg job        # print the composed config
  transformer-mt train --help           # config groups and every key

Errors are one line; set HYDRA_FULL_ERROR=1 (or debug=true) for the full traceback."""

# Hydra flags that take a value in the next argument.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun"}
_NO_PRECHECK_FLAGS = {"--help", "-h", "--hydra-help", "--shell-completion", "-sc", "--config-dir",
                      "-cd", "--config-path", "-cp", "--config-name", "-cn", "--experimental-rerun",
                      "--version", "--info", "-i"}

_MULTIRUN_FLAGS = {"-m", "--multirun"}
# Config options that come from Hydra plugins, and the extra that installs each.
_PLUGIN_EXTRAS = {"hydra/sweeper=optuna": "sweep", "hydra/launcher=joblib": "sweep",
                  "hydra/launcher=parallel": "sweep", "hydra/launcher=submitit_slurm": "slurm",
                  "hydra/launcher=submitit_local": "slurm", "hydra/launcher=slurm": "slurm"}

log = logging.getLogger(__name__)
_verbatim: dict[str, str] = {}  # free text taken out of the overrides, for translate


class UserError(Exception):
    """An error the user can fix; shown as one line without a traceback."""


def _run_dir(checkpoint_dir: str | None, resume: str | None, default: str) -> str:
    """Hydra's run directory: an explicit checkpoint.dir, the resumed run's directory, or a new one."""
    if checkpoint_dir:
        return checkpoint_dir
    if resume:
        path = Path(resume)
        return str(path.parent if path.suffix == ".pt" else path)
    return default


def _now(pattern: str) -> str:
    """Hydra's `${now:...}` at the run's start: under torchrun rank 0's, so all ranks share a directory."""
    from transformer_mt import distributed

    return distributed.start_time().strftime(pattern)


def _register_resolvers() -> None:
    if not OmegaConf.has_resolver("tmt_run_dir"):
        OmegaConf.register_new_resolver("tmt_run_dir", _run_dir)
    if not OmegaConf.has_resolver("tmt_now"):
        OmegaConf.register_new_resolver("tmt_now", _now, use_cache=True)


def _split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra's flags (and their values) from key=value overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    args = list(args)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.append(arg)
        if arg in _FLAGS_WITH_VALUE and args and not args[0].startswith("-"):
            flags.append(args.pop(0))
    return flags, overrides


def _with_resumed_overrides(args: list[str]) -> list[str]:
    """`resume=<run>` replays the run's own overrides first, so the same config is composed again;
    overrides given now come after them and win (e.g. more `training.epochs`)."""
    resume = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    if not resume or not resume[-1]:
        return args
    from transformer_mt.checkpoint import LATEST, load_checkpoint, resolve_checkpoint

    state = load_checkpoint(resolve_checkpoint(resume[-1], prefer=LATEST))
    saved = [o for o in state.get("overrides", []) if not o.startswith(("resume=", "checkpoint.dir="))]
    return [*saved, *args]


def _take_verbatim_text(args: list[str]) -> list[str]:
    """`text=...` may hold commas, quotes and `=`: take it out before Hydra's grammar sees it."""
    kept: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            _verbatim["text"] = " ".join(args[i + 1:])
            break
        if arg.startswith("text="):
            _verbatim["text"] = arg[len("text="):]
        else:
            kept.append(arg)
    return kept


def explain_composition_error(ex: BaseException) -> str:
    """Turn Hydra/OmegaConf's multi-line composition errors into one actionable line."""
    text = str(ex)
    cause = ex.__cause__
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        extra = _PLUGIN_EXTRAS.get(f"{group}={option}")
        if extra:
            return (f"{group}={option} needs a Hydra plugin that is not installed; "
                    f"install it with: pip install -e '.[{extra}]'")
        options = re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE)
        allowed = f"; choose one of: {', '.join(options)}" if options else ""
        return f"{group}={option} is not a known option{allowed}"
    not_in_struct = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Key '([^']+)' (?:is not in struct|not in '\w+')", text + str(cause or ""))
    if not_in_struct:
        key = not_in_struct.group(1)
        full = re.search(r"full_key: (\S+)", f"{text}\n{cause or ''}")
        name = full.group(1) if full else key
        return f"'{name}' is not a known key; check the spelling (`--cfg job` lists every key)"
    merging = re.search(r"Error merging override (\S+)", text)
    detail = str(cause) if cause is not None else text
    first = next((line.strip() for line in detail.splitlines() if line.strip()), detail)
    full_key = re.search(r"full_key: (\S+)", detail)
    if merging:
        return f"{merging.group(1)}: {first}"
    if full_key:
        return f"{full_key.group(1)}: {first}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip() and
                    not line.startswith(("Config search path", "\tprovider", "Set the environment")))


def _sweep_values(override: Any) -> list[str]:
    """The values to check of a sweep: each of a list, range or choice, the two ends of an interval."""
    value = override.value()
    if isinstance(value, IntervalSweep):  # Optuna's continuous ranges
        return [str(value.start), str(value.end)]
    return list(override.sweep_string_iterator())


def _sweep_variants(overrides: list[str]) -> list[list[str]]:
    """One override list per value of each sweep (a,b,c / range / choice / interval), others at their
    first."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    firsts: list[str] = []
    options: list[tuple[int, list[str]]] = []
    for i, override in enumerate(parsed):
        if override.is_sweep_override():
            values = [f"{override.get_key_element()}={v}" for v in _sweep_values(override)]
            firsts.append(values[0])
            options.append((i, values))
        else:
            firsts.append(override.input_line)
    variants = [firsts]
    for i, values in options:
        for value in values[1:]:
            variant = list(firsts)
            variant[i] = value
            variants.append(variant)
    return variants


def precheck(command: str, args: list[str]) -> None:
    """Compose and validate the config as Hydra will, raising UserError with one line."""
    flags, overrides = _split_flags(args)
    if any(flag in _NO_PRECHECK_FLAGS for flag in flags):
        return
    from hydra import compose, initialize_config_dir

    try:
        variants = _sweep_variants(overrides)
    except Exception as ex:  # noqa: BLE001 - the override grammar raises several types
        raise UserError(f"cannot parse overrides: {explain_composition_error(ex)}") from ex
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=command):
        for variant in variants:
            try:
                cfg = compose(config_name=command, overrides=variant)
            except Exception as ex:  # noqa: BLE001 - composition errors come in many classes
                raise UserError(explain_composition_error(ex)) from ex
            try:
                validate(to_dataclass(cfg, SCHEMAS[command]))
            except ConfigError as ex:
                raise UserError(str(ex)) from ex


def _job(command: str) -> Callable[[Any], Any]:
    """Import the job lazily: `--help` and completion stay fast."""
    if command == "train":
        from transformer_mt.train import train
        return train
    if command == "evaluate":
        from transformer_mt.evaluate import evaluate
        return evaluate
    if command == "export":
        from transformer_mt.export import export
        return export
    from transformer_mt.translate import translate
    return translate


def run_command(command: str, cfg: DictConfig) -> Any:
    """The Hydra task function: typed config in, the job's result out (a sweep's objective)."""
    typed = to_dataclass(cfg, SCHEMAS[command])
    if command == "translate" and "text" in _verbatim:
        typed.text = _verbatim["text"]
    try:
        validate(typed)
        return _job(command)(typed)
    except Exception as ex:
        if typed.debug or os.environ.get("HYDRA_FULL_ERROR") == "1" or not is_user_error(ex):
            raise
        print(f"error: {ex}", file=sys.stderr)
        sys.exit(2)


def is_user_error(ex: BaseException) -> bool:
    """Errors whose message already tells the user what to do."""
    from transformer_mt.checkpoint import CheckpointError
    from transformer_mt.data import DataError
    from transformer_mt.train import TrainingError

    return isinstance(ex, (ConfigError, DataError, CheckpointError, TrainingError, UserError))


def _hydra_main(command: str) -> Callable[[], Any]:
    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=command)
    def task(cfg: DictConfig) -> Any:
        return run_command(command, cfg)

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
    _hydra_main(command)()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of `python -m transformer_mt`."""
    args = list(sys.argv[1:] if argv is None else argv)
    register_schemas()
    _register_resolvers()
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE.format(commands="\n".join(f"  {k:<10} {v}" for k, v in COMMANDS.items())))
        return 0
    if args[0] in ("-sc", "--shell-completion"):
        return _completion(args)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: unknown command '{command}'; choose one of: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    if command == "translate":
        rest = _take_verbatim_text(rest)
    try:
        world = _torchrun_world()
        if world is not None:
            _check_distributed(command, rest)
        if command == "train":
            rest = _with_resumed_overrides(rest)
        precheck(command, rest)
    except Exception as ex:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not is_user_error(ex):
            raise
        print(f"error: {ex}", file=sys.stderr)
        return 2
    if world is None:
        sys.argv = ["transformer-mt", *rest]
        _hydra_main(command)()
        return 0
    from transformer_mt import distributed

    try:
        sys.argv = ["transformer-mt", *_join_process_group(world, rest)]
        _hydra_main(command)()
    finally:
        distributed.shutdown()
    return 0


def _torchrun_world() -> Any:
    """The `distributed.World` torchrun describes when it started several processes, else None.

    A plain run doesn't import torch here, so `--help` and completion stay fast.
    """
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return None
    from transformer_mt import distributed

    world = distributed.env_world()
    return world if world.distributed else None


def _check_distributed(command: str, args: list[str]) -> None:
    """Under torchrun only `train` runs, and as one job: a sweep's jobs are launched by Hydra instead."""
    if command != "train":
        raise UserError(f"{command} runs in one process; start it without torchrun")
    if _MULTIRUN_FLAGS & set(_split_flags(args)[0]):
        raise UserError("torchrun runs one training job on several processes; run a sweep (-m) without "
                        "torchrun, and its launcher starts the jobs")


def _join_process_group(world: Any, args: list[str]) -> list[str]:
    """Join the other ranks and take rank 0's start time; ranks > 0 leave the run directory to rank 0.

    They log warnings only and don't write Hydra's `.hydra/` files into the directory they share.
    """
    from transformer_mt import distributed

    distributed.init(world)
    distributed.share_start_time(world)
    if world.is_main:
        return args
    return [*args, "hydra.output_subdir=null", "hydra.job_logging.root.level=WARNING"]


if __name__ == "__main__":
    sys.exit(main())
