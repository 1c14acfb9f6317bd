"""The errors a person can fix: each is shown as one line that says what is wrong and what to change.

The command line prints them as `error: <message>` with exit code 2, without a traceback (unless
`traceback=true` or HYDRA_FULL_ERROR=1). Everything else is a bug, and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the command line shows its message as one line (exit code 2)."""


class ConfigError(UserError, ValueError):
    """A setting that cannot work; the message names the key and the allowed values."""


class DataError(UserError, ValueError):
    """A data file that cannot be used; the message names the file (and line) and what to do."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that is missing, corrupt, unsafe or does not fit the current run."""


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (diverged, out of memory); the message says what to change."""


class OutputError(UserError, RuntimeError):
    """An output file that cannot be written (a full disk, no permission); the message names it."""


class ExportError(ConfigError):
    """A model that a format cannot represent, or a model directory that cannot be loaded (one line)."""
