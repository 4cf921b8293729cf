"""Errors a researcher can act on.

Every error that the zoo raises on purpose derives from :class:`ZooError`; ``train.py`` prints its message
alone (no traceback through Hydra internals) and exits with status 2.
"""

from __future__ import annotations


class ZooError(Exception):
    """Base class of user-facing errors: the message says what was wrong and how to fix it."""


class ConfigError(ZooError, ValueError):
    """An invalid configuration value or combination of options."""


class DataError(ZooError, ValueError):
    """A malformed data file or sample; the message names the file (or sample), the line and the field."""


class CheckpointNotFoundError(ZooError, FileNotFoundError):
    """A checkpoint or exported model that was asked for does not exist; the message names the path."""


class NaNLossError(ZooError, FloatingPointError):
    """Training produced a non-finite loss, gradient or weight; the message names the step."""


class CheckpointError(ZooError, ValueError):
    """A checkpoint file exists but cannot be used (truncated, corrupt, not a checkpoint, or holding non-finite
    values); the message names the file."""


class DiskFullError(ZooError, OSError):
    """A file could not be written because its device (or the user's quota) is full; the message names the
    directory, what was kept and what to change."""


class RunInterrupted(ZooError):
    """Training was stopped by a signal (SIGINT/SIGTERM); the message says where the checkpoint is and how to resume.

    ``exit_code`` is the conventional status of a process ended by that signal (128 + signal number).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CollectiveTimeoutError(ZooError, TimeoutError):
    """A collective (all_reduce, broadcast, barrier, ...) waited longer than the process group's timeout: another rank
    stopped or took a different path; the message names this rank, the collective and the timeout option."""
