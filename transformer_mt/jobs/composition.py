"""Composing a command's config in this process, exactly as Hydra will when it runs the job.

`compose("train", ["model=tiny"])` returns the typed, validated config that `transformer-mt train
model=tiny` would run with: the same YAML files, schemas, resolvers (`resolvers.py`), and a HydraConfig
holding the job's number and output directory, so Hydra's own interpolations (`${hydra:job.num}`,
`${hydra:runtime.output_dir}`, `${now:...}`) resolve in any key. Tests and the Python API run jobs on
it; the command line uses `precheck` to compose every job of a sweep before Hydra starts, so that a
mistake ends the command at once with one line (`explain_composition_error`) instead of a traceback in
the middle of a sweep.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from transformer_mt.checkpoints.named import check_checkpoints, check_parent
from transformer_mt.config import (
    CONFIG_DIR,
    SCHEMAS,
    ConfigError,
    EngineConfig,
    validate,
)
from transformer_mt.config.overrides import (
    ENSEMBLE_COMMANDS,
    MULTIRUN_FLAGS,
    NO_PRECHECK_FLAGS,
    check_renamed,
    ensemble_checkpoints,
    split_flags,
    sweep_variants,
)
from transformer_mt.config.resolvers import register
from transformer_mt.config.typed import to_dataclass, unknown_key_message

# Config options that come from Hydra plugins, and the extra that installs each.
PLUGIN_EXTRAS = {"hydra/sweeper=optuna": "sweep", "hydra/launcher=joblib": "sweep",
                 "hydra/launcher=parallel": "sweep", "hydra/launcher=submitit_slurm": "slurm",
                 "hydra/launcher=submitit_local": "slurm", "hydra/launcher=slurm": "slurm"}


# -- composing -----------------------------------------------------------------------------------
def compose_hydra(command: str, overrides: Sequence[str], job_num: int | None = None) -> DictConfig:
    """The composed config with its `hydra` node, set as the current HydraConfig as Hydra's run_job
    sets it: the job's number (multirun when given) and its output directory."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=command):
        cfg = hydra_compose(config_name=command, overrides=list(overrides), return_hydra_config=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        if job_num is not None:
            cfg.hydra.mode, cfg.hydra.job.num, cfg.hydra.job.id = RunMode.MULTIRUN, job_num, str(job_num)
    HydraConfig.instance().set_config(cfg)  # interpolations of the output directory may need it
    if job_num is None:
        output_dir = OmegaConf.select(cfg, "hydra.run.dir")
    else:
        output_dir = os.path.join(cfg.hydra.sweep.dir, cfg.hydra.sweep.subdir)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = os.path.abspath(output_dir)
    HydraConfig.instance().set_config(cfg)
    return cfg


def compose(command: str, overrides: Sequence[str] = ()) -> Any:
    """The typed, validated config of `transformer-mt <command> <overrides>` (ConfigError if wrong)."""
    overrides = ensemble_checkpoints(command, overrides)
    check_renamed(overrides)
    return _checked(command, overrides, None)[1]


# -- checks before Hydra launches the jobs -----------------------------------------------------
def _run_files_together(typed: Any, cfg: DictConfig) -> None:
    """A run keeps checkpoints, log and config in one directory: checkpoint.dir, when given, is Hydra's
    output directory too (or lies inside it); any other combination would split the run silently."""
    wanted = getattr(getattr(typed, "checkpoint", None), "dir", None)
    if not wanted or getattr(typed, "resume", None):
        return
    hydra_dir = Path(cfg.hydra.runtime.output_dir).resolve()  # links resolved on both sides
    run_dir = Path(wanted).expanduser().resolve()
    if run_dir != hydra_dir and not run_dir.is_relative_to(hydra_dir):
        raise ConfigError(f"checkpoint.dir={wanted} and Hydra's output directory "
                          f"{cfg.hydra.runtime.output_dir} differ, which would split the run's files; "
                          "checkpoint.dir is the run directory: drop the hydra.run.dir / hydra.sweep.* "
                          "override")


def _run_directory_free(typed: Any) -> None:
    """Before Hydra writes its files into the run directory: no other run holds it, and a fresh run
    would not mix its files with another's (rundir.py). Under torchrun rank 0 checks for all ranks."""
    if os.environ.get("RANK", "0") != "0":
        return
    from transformer_mt.training import rundir  # (imports torch: not for --help)

    rundir.check_available(Path(typed.checkpoint.dir).expanduser().resolve(), typed.resume,
                           typed.checkpoint.overwrite)


def _shared_run_dirs(dirs: list[tuple[int, str | None]]) -> None:
    """Jobs of one sweep must not write into the same checkpoint directory."""
    seen: dict[str, int] = {}
    for job, run_dir in dirs:
        if run_dir is None:
            continue
        key = str(Path(run_dir).expanduser().resolve())
        if key in seen:
            raise ConfigError(f"jobs {seen[key]} and {job} of this sweep would share "
                              f"checkpoint.dir={run_dir}; "
                            "give each job its own, e.g. 'checkpoint.dir=runs/${hydra:job.num}'")
        seen[key] = job


def precheck(command: str, args: Sequence[str]) -> list[Any]:
    """Compose and validate every job as Hydra will, raising ConfigError with one line; the typed config
    of each job checked (none for a flag that runs no job). With `--cfg`, which prints the config instead
    of running it, what a run needs may be missing (no checkpoint=)."""
    flags, overrides = split_flags(args)
    if NO_PRECHECK_FLAGS & set(flags):
        return []
    check_renamed(overrides)
    try:
        variants = sweep_variants(overrides)
    except Exception as ex:  # noqa: BLE001 - the override grammar raises several types
        raise ConfigError(f"cannot parse overrides: {explain_composition_error(ex)}") from ex
    multirun, printing = bool(MULTIRUN_FLAGS & set(flags)), bool({"--cfg", "-c"} & set(flags))
    checked: list[Any] = []
    for job, variant in enumerate(variants):
        cfg, typed = _checked(command, variant, job if multirun else None, complete=not printing,
                              headers=not printing)
        _run_files_together(typed, cfg)
        if command == "train" and not printing:
            _run_directory_free(typed)
        checked.append(typed)
    if multirun and len(variants) == 1 and not cfg.hydra.sweeper._target_.endswith("BasicSweeper"):
        checked.append(_checked(command, variants[0], 1)[1])  # a search sweeper numbers its trials: 0, 1, ...
    _shared_run_dirs([(job, getattr(getattr(typed, "checkpoint", None), "dir", None))
                      for job, typed in enumerate(checked)])
    return checked


def _checked(command: str, overrides: Sequence[str], job_num: int | None, complete: bool = True,
             headers: bool = False) -> tuple[DictConfig, Any]:
    """The composed config and its validated typed form, or ConfigError with one line; with `headers`
    (the command line's check), the checkpoints it names checked from their headers too."""
    try:
        cfg = compose_hydra(command, overrides, job_num)
    except Exception as ex:  # noqa: BLE001 - composition errors come in many classes
        raise ConfigError(explain_composition_error(ex)) from ex
    typed = to_dataclass(cfg, SCHEMAS[command])
    validate(typed, complete)
    if headers:
        _check_headers(command, typed)
    if command == "train" and typed.init:  # fine-tuning: the parent's model, tokenizer and languages
        from transformer_mt.training import finetune

        finetune.check_config(typed, finetune.load_parent(typed.init, mmap=True)[1])
    if command == "train" and typed.distill.init_from_teacher and not typed.resume:  # the teacher's model
        from transformer_mt.training import finetune, student_init

        student_init.check_config(typed, finetune.load_parent(typed.distill.teacher, mmap=True)[1])
    return cfg, typed


def _check_headers(command: str, typed: Any) -> None:
    """The checkpoints a job reads, checked from their headers before anything imports torch (whose
    import alone takes some 280 MiB): a crafted file claiming a huge model is refused at little cost.
    The loader checks them again, and their weights, when the job runs; engine=ctranslate2 reads an
    exported model_dir instead."""
    if command == "train":
        if typed.init:
            check_parent(typed.init)
    elif typed.checkpoint and not (isinstance(typed, EngineConfig) and typed.engine == "ctranslate2"):
        check_checkpoints(typed.checkpoint, ensemble=command in ENSEMBLE_COMMANDS)


# -- one line for a failed composition --------------------------------------------------------
def explain_composition_error(ex: BaseException) -> str:
    """Turn Hydra/OmegaConf's multi-line composition errors into one actionable line."""
    text = str(ex)
    cause = ex.__cause__
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        extra = PLUGIN_EXTRAS.get(f"{group}={option}")
        if extra:
            return (f"{group}={option} needs a Hydra plugin that is not installed; "
                    f"install it with: pip install -e '.[{extra}]'")
        options = re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE)
        allowed = f"; choose one of: {', '.join(options)}" if options else ""
        return f"{group}={option} is not a known option{allowed}"
    not_in_struct = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Key '([^']+)' (?:is not in struct|not in '\w+')", text + str(cause or ""))
    if not_in_struct:
        full = re.search(r"full_key: (\S+)", f"{text}\n{cause or ''}")
        return unknown_key_message(full.group(1) if full else not_in_struct.group(1))
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
