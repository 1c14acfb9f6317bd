"""Composing a command's config in this process, exactly as Hydra will when it runs the job.

`compose("train", ["model=tiny"])` returns the typed, validated config that `transformer-mt train
model=tiny` would run with: the same YAML files, schemas, resolvers, and a HydraConfig holding the job's
number and output directory, so Hydra's own interpolations (`${hydra:job.num}`,
`${hydra:runtime.output_dir}`, `${now:...}`) resolve in any key. Tests and the Python API run jobs on
it; the command line uses `precheck` to compose every job of a sweep before Hydra starts, so that a
mistake ends the command at once with one line instead of a traceback in the middle of a sweep.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from transformer_mt.config import (
    CONFIG_DIR,
    IGNORED_BY_TRAIN,
    RENAMED,
    SCHEMAS,
    ConfigError,
    to_dataclass,
    unknown_key_message,
    validate,
)

log = logging.getLogger(__name__)
# Config options that come from Hydra plugins, and the extra that installs each.
PLUGIN_EXTRAS = {"hydra/sweeper=optuna": "sweep", "hydra/launcher=joblib": "sweep",
                 "hydra/launcher=parallel": "sweep", "hydra/launcher=submitit_slurm": "slurm",
                 "hydra/launcher=submitit_local": "slurm", "hydra/launcher=slurm": "slurm"}


# -- what Hydra needs before it composes anything ----------------------------------------------
def _explicit_dir(root: DictConfig) -> str | None:
    """checkpoint.dir, resolved, or None when unset or when it refers to Hydra's own output directory
    (which is being decided right now: then the run directory is nested inside Hydra's)."""
    try:
        value = OmegaConf.select(root, "checkpoint.dir", throw_on_missing=True)
    except Exception:  # noqa: BLE001 - `${hydra:runtime.output_dir}` is not known yet at this point
        return None
    return str(Path(value).expanduser()) if value else None


def _run_dir(default: str, *, _root_: DictConfig) -> str:
    """hydra.run.dir: checkpoint.dir when given, else the resumed run's directory, else
    <checkpoint.root>/<checkpoint.run_name> when named, else default (<root>/<dataset>-<src>-<tgt>-<time>)."""
    explicit = _explicit_dir(_root_)
    resume = OmegaConf.select(_root_, "resume")
    run_name = OmegaConf.select(_root_, "checkpoint.run_name")
    if explicit:
        return explicit
    if resume:
        path = Path(resume)
        return str(path.parent if path.suffix == ".pt" else path)
    if run_name:
        return str(Path(OmegaConf.select(_root_, "checkpoint.root")) / run_name)
    return default


def _job_subdir(default: str, *, _root_: DictConfig) -> str:
    """hydra.sweep.subdir: a sweep job's directory is its checkpoint.dir too (absolute, so that
    Hydra's join with the sweep directory leaves it as it is), else the job's number."""
    explicit = _explicit_dir(_root_)
    return str(Path(explicit).expanduser().resolve()) if explicit else default


def _now(pattern: str) -> str:
    """Hydra's `${now:...}` at the run's start: under torchrun rank 0's, so all ranks share a directory."""
    from transformer_mt import distributed

    return distributed.start_time().strftime(pattern)


def register() -> None:
    """The schemas (as `<command>_schema` for the YAML defaults lists) and our resolvers."""
    store = ConfigStore.instance()
    for command, schema in SCHEMAS.items():
        store.store(name=f"{command}_schema", node=schema)
    for name, resolver, cache in (("tmt_run_dir", _run_dir, False), ("tmt_job_subdir", _job_subdir, False),
                                  ("tmt_now", _now, True)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=cache)


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


# Commands whose `checkpoint=a.pt,b.pt` is an ensemble (decoding) rather than Hydra's sweep over files.
ENSEMBLE_COMMANDS = ("evaluate", "translate", "serve")


def ensemble_checkpoints(command: str, overrides: Sequence[str]) -> list[str]:
    """`checkpoint=a.pt,b.pt` quoted into one value, which decoding reads as an ensemble: Hydra would
    take the commas for a sweep (and refuse it without -m). A sweep over checkpoints stays possible with
    `checkpoint=choice(a.pt,b.pt)`; values already quoted or holding quotes are left as they are."""
    if command not in ENSEMBLE_COMMANDS:
        return list(overrides)
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "checkpoint" and "," in value and not re.search(r"['\"()\[\]]", value):
            override = f"checkpoint='{value}'"
        out.append(override)
    return out


def with_resumed_overrides(overrides: Sequence[str]) -> tuple[list[str], tuple[Path, dict[str, Any]] | None]:
    """`resume=<run>` replays the run's own overrides first, so the same config is composed again;
    overrides given now come after them and win (e.g. more `training.epochs`). Also returns the
    checkpoint it loaded, which training resumes from: a resumed run reads its checkpoint once."""
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    if not resume or not resume[-1]:
        return list(overrides), None
    from transformer_mt.checkpoint import load_latest_good

    path, state = load_latest_good(resume[-1])
    saved = [o for o in state.get("overrides", []) if not o.startswith(("resume=", "checkpoint.dir="))]
    return [*_upgraded(saved), *overrides], (path, state)


# -- checks before Hydra launches the jobs -----------------------------------------------------
def _renamed(override: str) -> str | None:
    """The old key an override uses, if it uses one (`debug=` is also the new group, with a name)."""
    key, _, value = override.lstrip("+~").partition("=")
    return key if key in RENAMED and (key != "debug" or value.lower() in ("true", "false")) else None


def check_renamed(overrides: Sequence[str]) -> None:
    """An old key name fails with one line that names the new one."""
    for override in overrides:
        if _renamed(override):
            raise ConfigError(unknown_key_message(_renamed(override)))


def _upgraded(saved: Sequence[str]) -> list[str]:
    """A resumed run's saved overrides in today's names; those train now refuses (it ignored them) go."""
    out = []
    for override in saved:
        old, key = _renamed(override), override.partition("=")[0]
        if old:
            out.append(RENAMED[old][0] + override[override.index("="):])
        elif key in IGNORED_BY_TRAIN:
            log.warning("resume: dropping the run's override %s, which train never used", override)
        else:
            out.append(override)
    return out


def _sweep_values(override: Any) -> list[str]:
    """The values to check of a sweep: each of a list, range or choice, the two ends of an interval."""
    value = override.value()
    if isinstance(value, IntervalSweep):  # Optuna's continuous ranges
        return [str(value.start), str(value.end)]
    return list(override.sweep_string_iterator())


def sweep_variants(overrides: Sequence[str]) -> list[list[str]]:
    """One override list per value of each sweep (a,b,c / range / choice / interval), the other sweeps
    at their first value: every value is checked, and every swept key varies against the first."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
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


def split_flags(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra's flags (and their values) from key=value overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.append(arg)
        if arg in FLAGS_WITH_VALUE and rest and not rest[0].startswith("-"):
            flags.append(rest.pop(0))
    return flags, overrides


# Hydra flags that take a value in the next argument; flags after which nothing runs.
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                    "--config-dir", "-cd", "--experimental-rerun"}
NO_PRECHECK_FLAGS = {"--help", "-h", "--hydra-help", "--shell-completion", "-sc", "--config-dir", "-cd",
                     "--config-path", "-cp", "--config-name", "-cn", "--experimental-rerun", "--version",
                     "--info", "-i"}
MULTIRUN_FLAGS = {"-m", "--multirun"}


def precheck(command: str, args: Sequence[str]) -> None:
    """Compose and validate every job as Hydra will, raising ConfigError with one line. With `--cfg`,
    which prints the config instead of running it, what a run needs may be missing (no checkpoint=)."""
    flags, overrides = split_flags(args)
    if NO_PRECHECK_FLAGS & set(flags):
        return
    check_renamed(overrides)
    try:
        variants = sweep_variants(overrides)
    except Exception as ex:  # noqa: BLE001 - the override grammar raises several types
        raise ConfigError(f"cannot parse overrides: {explain_composition_error(ex)}") from ex
    multirun, printing = bool(MULTIRUN_FLAGS & set(flags)), bool({"--cfg", "-c"} & set(flags))
    dirs: list[tuple[int, str | None]] = []
    for job, variant in enumerate(variants):
        cfg, typed = _checked(command, variant, job if multirun else None, complete=not printing)
        _run_files_together(typed, cfg)
        dirs.append((job, getattr(getattr(typed, "checkpoint", None), "dir", None)))
    if multirun and len(variants) == 1 and not cfg.hydra.sweeper._target_.endswith("BasicSweeper"):
        _, typed = _checked(command, variants[0], 1)  # a search sweeper numbers its trials: 0, 1, ...
        dirs.append((1, getattr(getattr(typed, "checkpoint", None), "dir", None)))
    _shared_run_dirs(dirs)


def _checked(command: str, overrides: Sequence[str], job_num: int | None,
             complete: bool = True) -> tuple[DictConfig, Any]:
    """The composed config and its validated typed form, or ConfigError with one line."""
    try:
        cfg = compose_hydra(command, overrides, job_num)
    except Exception as ex:  # noqa: BLE001 - composition errors come in many classes
        raise ConfigError(explain_composition_error(ex)) from ex
    typed = to_dataclass(cfg, SCHEMAS[command])
    validate(typed, complete)
    return cfg, typed


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
