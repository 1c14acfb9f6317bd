"""What a run started again, or from another run, reads before it is composed: `resume=<run>` replays the
run's own overrides (in today's key names), `init=<parent>` puts the parent's model and tokenizer keys
first. Both read a checkpoint (its header first, before torch is imported), which is why this is a job's
concern and not the config layer's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from transformer_mt.checkpoints.header import read_header
from transformer_mt.checkpoints.named import check_parent
from transformer_mt.checkpoints.paths import first_loadable
from transformer_mt.config.overrides import renamed_key
from transformer_mt.config.typed import RENAMED

log = logging.getLogger(__name__)
# Keys `train` used to accept and ignore; a resumed run's saved overrides drop them.
IGNORED_BY_TRAIN = ("decoding.n_best", "decoding.sampling", "decoding.temperature", "decoding.top_k",
                    "decoding.top_p")


def with_resumed_overrides(overrides: Sequence[str]) -> list[str]:
    """`resume=<run>` replays the run's own overrides first, so the same config is composed again;
    overrides given now come after them and win (e.g. more `training.epochs`). Only the overrides are
    read here (`checkpoint.saved_overrides`); training reads the checkpoint itself. A fine-tuning run
    resumed is a resumed run: its `init=` is not replayed (its checkpoint names the parent).
    Without resume=, `init=<parent>` puts the parent's model and tokenizer first (finetune.py)."""
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    if not resume or not resume[-1]:
        return _with_teacher(_with_parent(overrides))
    # its header first, without torch: a crafted checkpoint is refused before torch takes its memory
    first_loadable(resume[-1], read_header, warn=False)
    from transformer_mt.checkpoints.store import saved_overrides

    dropped = ("resume=", "init=", "checkpoint.dir=")
    saved = [o for o in saved_overrides(resume[-1]) if not o.startswith(dropped)]
    return [*_upgraded(saved), *overrides]


def _with_parent(overrides: Sequence[str]) -> list[str]:
    """`init=<parent>`: the parent's model and tokenizer keys before the overrides given, whose
    `model=`/`tokenizer=` choices must agree with them."""
    init = [o.split("=", 1)[1] for o in overrides if o.startswith("init=")]
    if not init or init[-1] in ("", "null"):
        return list(overrides)
    check_parent(init[-1])  # its header, before torch is imported
    from transformer_mt.training import finetune

    state = finetune.load_parent(init[-1], mmap=True)[1]
    finetune.check_choices(init[-1], state, overrides)
    return [*finetune.parent_overrides(state), *overrides]


def _with_teacher(overrides: Sequence[str]) -> list[str]:
    """`distill.teacher=<run>[,<run>...]`: the (first) teacher's tokenizer keys before the overrides given,
    whose `tokenizer=` choice must agree with them: a student keeps its teacher's tokenizer; with
    distill.init_from_teacher=true, its model keys but the depths too (training/student_init.py)."""
    given = [o.split("=", 1)[1].strip("'\"") for o in overrides if o.startswith("distill.teacher=")]
    teachers = [t.strip() for t in (given[-1] if given else "").split(",") if t.strip()]  # (quoted: cli.py)
    if not teachers or teachers[0] == "null":
        return list(overrides)
    for teacher in teachers:
        check_parent(teacher)  # its header, before torch is imported
    from transformer_mt.errors import ConfigError
    from transformer_mt.training import finetune

    state = finetune.load_parent(teachers[0], mmap=True)[1]
    problems = finetune.group_contradictions(state, overrides, ("tokenizer",))
    if problems:
        raise ConfigError(f"distill.teacher={given[-1]}: {'; '.join(problems)}; a student keeps its "
                          "teacher's tokenizer: drop that choice")
    inherited = finetune.parent_overrides(state, ("tokenizer",))
    if any(o.lower() == "distill.init_from_teacher=true" for o in overrides):  # its model too, but the depths
        from transformer_mt.training.student_init import DEPTHS

        depth = tuple(f"model.{key}=" for key in DEPTHS)
        problems = [p for p in finetune.group_contradictions(state, overrides, ("model",))
                    if not p.startswith(depth)]
        if problems:
            raise ConfigError(f"distill.init_from_teacher=true: {'; '.join(problems)}; a student started "
                              "from its teacher keeps all but its depths: drop that choice")
        inherited += [o for o in finetune.parent_overrides(state, ("model",)) if not o.startswith(depth)]
    return [*inherited, *overrides]


def _upgraded(saved: Sequence[str]) -> list[str]:
    """A resumed run's saved overrides in today's names; those train now refuses (it ignored them) go."""
    out = []
    for override in saved:
        old, key = renamed_key(override), override.partition("=")[0]
        if old:
            out.append(RENAMED[old][0] + override[override.index("="):])
        elif key in IGNORED_BY_TRAIN:
            log.warning("resume: dropping the run's override %s, which train never used", override)
        else:
            out.append(override)
    return out
