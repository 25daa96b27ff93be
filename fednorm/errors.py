"""Exception hierarchy of fednorm.

Every error caused by a bad value derives from :class:`FednormError`, itself a
``ValueError``, so callers can catch one type; the CLI prints these without a
traceback. Missing or corrupt files raise :class:`DatasetError` (a
``RuntimeError``, as torchvision does), and a run that blows up numerically raises
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


class DatasetError(RuntimeError):
    """Raised when a dataset is missing, truncated or fails its checksum."""


class DivergenceError(RuntimeError):
    """Raised when a loss or a parameter becomes NaN/Inf; names round, client and method."""


class RoundFailedError(RuntimeError):
    """Raised when fewer than ``min_clients`` clients of a round answer; names the round and the causes."""


class RunWriteError(RuntimeError):
    """Raised when a run's file cannot be written (a full disk, a file-size limit, a folder that
    vanished); names the file. The run's last good checkpoint is kept."""

    def __init__(self, path: object, cause: OSError) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"could not write {path}: {cause.strerror or cause}")

    def with_hint(self, hint: str) -> "RunWriteError":
        """The same error with what to do next appended to its message."""
        self.args = (f"{self.args[0]}; {hint}",)
        return self
