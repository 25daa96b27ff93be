"""What a run trained on, when the data did not come from its config.

A run built from its config (``dataset``, ``partition``, ``seed``, ...) can rebuild its data from
``config.yaml``. Data handed to :func:`fednorm.run` from Python cannot be rebuilt: recording it
under the config's ``dataset`` (the default, the embedded digits) made ``fednorm run --resume``
train on the digits instead, silently. Such a run is recorded as ``dataset: user:NAME`` and
``partition: user:NAME``, with :func:`describe_data` in ``dataset_args`` (shapes, classes, client
sizes and a content fingerprint); loading ``user:NAME`` from a config refuses with the way to
resume from Python, where the data given is checked against the fingerprint.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Protocol, Sequence

import torch

from ..config_roles import DATA_FIELDS, USER_PREFIX, is_user_name
from ..errors import DatasetError


class FederatedData(Protocol):
    """What provenance reads of :class:`fednorm.data.federated.FederatedData` (which imports this
    module, so this one names only the fields)."""

    info: Any
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    client_train: Sequence[torch.Tensor]
    client_test: Sequence[torch.Tensor]
    augment: Any

    @property
    def num_classes(self) -> int: ...

__all__ = ["USER_PREFIX", "DATA_FIELDS", "data_recipe", "fingerprint", "describe_data", "is_user_dataset",
           "user_data_error"]

# USER_PREFIX and DATA_FIELDS (the config fields that decide a run's client data; ``data_dir`` says
# only where it is) come from the fields' roles in fednorm/config_roles.py.


def data_recipe(config: Any) -> dict[str, Any]:
    """The fields of ``config`` that :func:`~fednorm.data.federated.federated_data_from_config` builds from."""
    return {k: getattr(config, k) for k in DATA_FIELDS}


def is_user_dataset(name: str) -> bool:
    return is_user_name(name)


def fingerprint(data: FederatedData) -> str:
    """A content hash of the samples, labels, client splits and augmentation flag (BLAKE2b, 128 bits).

    Samples are hashed as stored (dtype and values), so the same tensors passed again give the same
    fingerprint on any machine; a changed pixel, label or client assignment gives another.
    """
    h = hashlib.blake2b(digest_size=16)

    def add(t: torch.Tensor) -> None:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    for t in (data.train_x, data.train_y, data.test_x, data.test_y, *data.client_train, *data.client_test):
        add(t)
    h.update(f"augment={bool(data.augment)};classes={data.num_classes}".encode())
    return "blake2b:" + h.hexdigest()


def describe_data(data: FederatedData) -> dict[str, Any]:
    """What a run records about data given from Python: enough to recognise it again."""
    return {
        "name": data_name(data),
        "train_shape": list(data.train_x.shape),
        "test_shape": list(data.test_x.shape),
        "num_classes": int(data.num_classes),
        "client_sizes": [int(len(ix)) for ix in data.client_train],
        "fingerprint": fingerprint(data),
    }


def data_name(data: FederatedData) -> str:
    name = getattr(data, "name", None) or getattr(data.info, "name", None) or "data"
    return str(name).replace(":", "_").strip() or "data"


def user_data_error(name: str, run_dir: str | None = None) -> DatasetError:
    """The refusal to rebuild ``user:NAME`` data from a config."""
    where = run_dir or "RUN_DIR"
    return DatasetError(
        f"dataset '{name}' came from Python, which no command can rebuild from the config: give the same data from Python "
        f"(to resume: fednorm.run(resume='{where}', data=...), checked against its fingerprint)")


def check_same_data(recorded: Mapping[str, Any], data: FederatedData, run_dir: str, verb: str = "resume") -> None:
    """Refuse ``data`` unless it is the data the run at ``run_dir`` recorded (its fingerprint);
    ``verb``: what the caller does with the run, for the message."""
    from ..errors import ConfigError

    now = describe_data(data)
    if now["fingerprint"] != recorded.get("fingerprint"):
        differs = [k for k in ("train_shape", "test_shape", "num_classes", "client_sizes") if now[k] != recorded.get(k)]
        detail = f"{', '.join(differs)} differ" if differs else "same shapes and sizes, other values"
        raise ConfigError(f"cannot {verb} {run_dir}: the data given is not the data it trained on ({detail}; fingerprint "
                          f"{now['fingerprint'][:20]}... vs {str(recorded.get('fingerprint'))[:20]}...)")


class _UserData:
    """The registry entry behind ``user:NAME``: data given from Python, which no config can load."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise user_data_error(f"{USER_PREFIX}:{self.name}")


def _resolve(rest: str) -> _UserData:
    return _UserData(rest)


def _register() -> None:
    from .datasets import DATASETS
    from .partition import PARTITIONS

    for registry in (DATASETS, PARTITIONS):  # so that a recorded run's config validates
        registry.add_prefix(USER_PREFIX, _resolve)


_register()
