"""Exception hierarchy of fednorm.

Every error caused by bad input derives from :class:`FednormError`, itself a
``ValueError``, so callers can catch one type; the CLI prints these without a
traceback. Missing or corrupt data raise :class:`DatasetError`, a ``FednormError``
that is also a ``RuntimeError`` (as torchvision raises for a missing dataset, so
``except RuntimeError`` still catches it), and a run that blows up numerically raises
:class:`DivergenceError`.
"""

from __future__ import annotations

__all__ = [
    "FednormError",
    "ConfigError",
    "UnknownNameError",
    "PartitionError",
    "InconsistentUpdateError",
    "DatasetError",
    "DivergenceError",
    "RoundFailedError",
    "RunDirectoryRemovedError",
    "RunWriteError",
]


class FednormError(ValueError):
    """Root of fednorm's bad-value errors."""


class ConfigError(FednormError):
    """Raised when an experiment configuration is invalid; the message names the field."""


class UnknownNameError(FednormError):
    """Raised when a registry lookup fails; the message lists the valid names."""


class PartitionError(FednormError):
    """Raised when a partition cannot be built with the requested parameters."""


class InconsistentUpdateError(FednormError):
    """Raised when client updates disagree in keys, shapes or dtypes."""


class DatasetError(FednormError, RuntimeError):
    """Raised when a dataset is missing, truncated or fails its checksum, or when data given from
    Python does not fit together (shapes, labels, an empty test set). A :class:`FednormError`
    like every bad input, and a ``RuntimeError`` as torchvision's missing-dataset error is."""


class DivergenceError(RuntimeError):
    """Raised when a loss or a parameter becomes NaN/Inf; names round, client and method."""


class RoundFailedError(RuntimeError):
    """Raised when fewer than ``min_clients`` clients of a round answer; names the round and the causes."""


class RunDirectoryRemovedError(FileNotFoundError):
    """The run directory a run writes was removed (or replaced) while the run trained: its
    config, metrics and checkpoints went with it, so there is nothing to resume (issue 50: the run
    re-created the folder with a checkpoint alone and reported success)."""

    def __init__(self, path: object) -> None:
        super().__init__(2, f"the run directory {path} was removed while the run was training, with its config, "
                         "metrics and checkpoints; nothing is left to resume: start the run again")
        self.removed = path


class RunWriteError(RuntimeError):
    """Raised when a run's file cannot be written (a full disk, a file-size limit, a folder that
    vanished); names the file. The run's last good checkpoint is kept."""

    def __init__(self, path: object, cause: OSError) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"could not write {path}: {cause.strerror or cause}")

    def with_hint(self, hint: str) -> "RunWriteError":
        """The same error with what to do next appended to its message (none for a run directory
        that was removed: its cause already says what to do, and there is no checkpoint to resume)."""
        if not isinstance(self.cause, RunDirectoryRemovedError):
            self.args = (f"{self.args[0]}; {hint}",)
        return self


class StoppedAtOnce(KeyboardInterrupt):
    """A run stopped mid-round by a second SIGINT/SIGTERM; its last checkpoint stands.
    ``signum`` is the signal that asked it to stop (130/143 for the shell)."""

    def __init__(self, signum: int | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
