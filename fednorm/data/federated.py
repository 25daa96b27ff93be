"""A dataset split over clients, held as tensors in memory.

Training and test images are normalised once into float tensors; a client is just an index
tensor into them, so drawing a batch is one ``index_select`` with no per-sample Python.
Each client also gets a test split with its own label mix (the LN and FedBN papers evaluate
per client), carved out of the global test set by :func:`~fednorm.data.partition.split_like`;
with a multi-source dataset whose clients each hold one source (FedBN's feature shift), a
client's test split is drawn from its own source's test set instead.
"""

from __future__ import annotations

import dataclasses
import warnings
import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from ..config_roles import SPLIT_FIELDS
from ..errors import PartitionError
from .datasets import DatasetInfo, dataset_to_tensors, load_dataset
from .partition import client_domains, label_histogram, partition, split_by_domain, split_like, split_like_by_domain

__all__ = ["FederatedData", "build_federated_data", "cached_federated_data", "crop_fill_values", "federated_data_from_config",
           "input_norm_values", "repartition"]


@dataclass
class FederatedData:
    """Train/test tensors plus the per-client index sets.

    Attributes:
        info: dataset facts (classes, channels, image size, normalisation, augmentation).
        train_x, train_y: all training samples (``N×C×H×W`` float, ``N`` int64).
        test_x, test_y: the global test set.
        client_train: one sorted int64 index tensor into ``train_*`` per client.
        client_test: one index tensor into ``test_*`` per client, with its label mix.
        augment: apply random crop + flip to training batches.
        domain_names: the sources of a multi-source dataset (``None`` otherwise).
        client_domain: the source of each client when each holds one source, else ``None``.
        test_domain: the source of each test sample of a multi-source dataset (``None``
            otherwise), so a model is scored per source (a client holding several sources).
        name: what a run records the data as when it was not built from the run's config
            (``dataset: user:NAME``; default: ``info.name``).
        recipe: the config fields it was built from (``federated_data_from_config``), so a
            run can tell its config's data from data of the user's own.
        client_val: one index tensor into ``train_*`` per client, held out of its training
            samples to select a model by validation accuracy (``validation_fraction``;
            ``fednorm.data.validation.hold_out_validation``), else ``None``.
    """

    info: DatasetInfo
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    client_train: list[torch.Tensor]
    client_test: list[torch.Tensor]
    augment: bool = False
    domain_names: list[str] | None = None
    client_domain: list[int] | None = None
    test_domain: torch.Tensor | None = None
    name: str | None = None
    recipe: dict | None = None
    client_val: list[torch.Tensor] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    def client_sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_train], dtype=np.int64)

    def histogram(self) -> np.ndarray:
        """Per-client training label histogram, ``[num_clients, num_classes]``."""
        parts = [ix.cpu().numpy() for ix in self.client_train]
        return label_histogram(self.train_y.cpu().numpy(), parts, self.num_classes)

    @classmethod
    def from_tensors(
        cls,
        clients: Sequence[tuple[torch.Tensor, ...]],
        test: tuple[torch.Tensor, torch.Tensor] | Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
        *,
        name: str = "tensors",
        num_classes: int | None = None,
        augment: bool = False,
        seed: int = 0,
    ) -> "FederatedData":
        """Your own clients' tensors as a federation: ``clients[k] = (x_k, y_k)`` with ``x_k`` float
        ``N_k×C×H×W`` (or ``N_k×F``), already normalised as you want the model to see them, and
        ``y_k`` integer labels. A run records it as ``user:NAME`` with a content fingerprint
        (``fednorm.data.provenance``).

        The test data, one of:

        - each client's own: ``clients[k] = (x_k, y_k, x_test_k, y_test_k)``, or ``test`` a list
          of one ``(x, y)`` per client. Use this when clients differ in their features (FedBN's
          feature shift: a client's test data must carry its own shift); each client is scored
          on its own, and the global test accuracy is over the union of them.
        - one global test set, ``test = (x, y)``, cut into per-client test splits with each
          client's training label mix (as fednorm's own datasets are): for label skew.

        Warns when test samples carry a class that no client trains on (or reach no client's
        split).

        Args:
            clients: one ``(x_k, y_k)`` or ``(x_k, y_k, x_test_k, y_test_k)`` per client.
            test: one global test set ``(x, y)``, or a list of one ``(x, y)`` per client
                (default: None, the clients carry their own).
            name: the data's name in the run's record (``dataset: user:NAME``).
            num_classes: the class count (default: the largest label + 1).
            augment: fednorm's random crop + flip per training batch (image data).
            seed: the seed of the global test set's cut into per-client splits.

        Returns:
            A :class:`FederatedData`: client ``k`` trains on ``x_k`` and is scored on its own test
            split (``client_test[k]``); ``num_clients``, ``num_classes`` and ``histogram()`` (the
            per-client label counts) describe it. Pass it as ``fednorm.run(data=...)``.

        Raises:
            DatasetError: shapes, dtypes or labels that do not fit together, or no test data at
                all (one line, naming the client).

        Example:
            >>> import torch
            >>> from fednorm import FederatedData
            >>> g = torch.Generator().manual_seed(0)
            >>> clients = [(torch.randn(12, 1, 8, 8, generator=g) + k, torch.arange(12) % 3,  # client k's images shifted by k
            ...             torch.randn(6, 1, 8, 8, generator=g) + k, torch.arange(6) % 3)    # and so are its test images
            ...            for k in range(3)]
            >>> data = FederatedData.from_tensors(clients, name="shifted")
            >>> data.num_clients, data.num_classes, [len(ix) for ix in data.client_test]
            (3, 3, [6, 6, 6])
            >>> FederatedData.from_tensors([(torch.randn(4, 2), torch.arange(3))], test=(torch.randn(2, 2), torch.arange(2)))
            Traceback (most recent call last):
            fednorm.errors.DatasetError: client 0: ...
        """
        from ..errors import DatasetError

        if not clients:
            raise DatasetError("from_tensors needs at least one client (clients=[(x, y), ...])")
        xs, ys, own_tests = [], [], []
        for k, item in enumerate(clients):
            if not (isinstance(item, (tuple, list)) and len(item) in (2, 4) and all(isinstance(t, torch.Tensor) for t in item)):
                raise DatasetError(f"client {k}: expected tensors (x, y) or (x, y, x_test, y_test), got {type(item).__name__}"
                                   + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""))
            x, y = item[0], item[1]
            _check_pair(x, y, f"client {k}", xs[0].shape[1:] if xs else None)
            xs.append(x)
            ys.append(y.long())
            if len(item) == 4:
                own_tests.append((item[2], item[3]))
        if own_tests and len(own_tests) != len(clients):
            raise DatasetError("give every client its test data (x, y, x_test, y_test), or none of them")
        if own_tests and test is not None:
            raise DatasetError("the clients carry their own test data (x, y, x_test, y_test): leave test out")
        per_client = _per_client_tests(test, len(clients)) if not own_tests else own_tests
        if per_client is None:
            if test is None:
                raise DatasetError("from_tensors needs test data: test=(x, y) for one global test set, a list of one "
                                   "(x, y) per client, or clients=[(x, y, x_test, y_test), ...]")
            if not (isinstance(test, (tuple, list)) and len(test) == 2 and all(isinstance(t, torch.Tensor) for t in test)):
                raise DatasetError(f"test: expected a pair of tensors (x, y) or a list of one pair per client ({len(clients)}), "
                                   f"got {type(test).__name__}")
            tests = [test]
        else:
            tests = list(per_client)
        for k, (tx, ty) in enumerate(tests):
            _check_pair(tx, ty, "test" if per_client is None else f"client {k}'s test data", xs[0].shape[1:])
        tx = torch.cat([t[0] for t in tests]).float()
        ty = torch.cat([t[1].long() for t in tests])
        if len(ty) == 0:
            raise DatasetError("the test data is empty: every accuracy would be NaN; give each client (or the "
                               "federation) test samples")
        labels = torch.cat([*ys, ty])
        k_classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
        if int(labels.min()) < 0 or int(labels.max()) >= k_classes:
            raise DatasetError(f"labels must lie in [0, {k_classes}); found {int(labels.min())}..{int(labels.max())}")
        train_x, train_y = torch.cat(xs).float(), torch.cat(ys)
        sizes = [len(x) for x in xs]
        starts = np.cumsum([0, *sizes])
        parts = [np.arange(starts[i], starts[i + 1]) for i in range(len(sizes))]
        if per_client is None:
            hist = label_histogram(train_y.numpy(), parts, k_classes)
            test_parts = split_like(ty.numpy(), hist, seed=seed)
            unused = len(ty) - sum(len(p) for p in test_parts)
            if unused:
                warnings.warn(f"{unused} of {len(ty)} test samples reach no client's test split: their classes are in no "
                              "client's training data (give each client its own test data to score it on all of it)",
                              stacklevel=2)
        else:
            test_starts = np.cumsum([0, *[len(t[1]) for t in tests]])
            test_parts = [np.arange(test_starts[i], test_starts[i + 1]) for i in range(len(tests))]
            untrained = sorted(set(ty.tolist()) - set(train_y.tolist()))
            if untrained:
                n = int(sum(int((ty == c).sum()) for c in untrained))
                warnings.warn(f"{n} of {len(ty)} test samples carry classes no client trains on ({untrained[:5]}"
                              f"{', ...' if len(untrained) > 5 else ''})", stacklevel=2)
        channels = train_x.shape[1] if train_x.dim() == 4 else 1
        size = tuple(train_x.shape[2:]) if train_x.dim() == 4 else (1, train_x.shape[1])
        info = DatasetInfo(name=name, num_classes=k_classes, in_channels=channels, image_size=size,  # type: ignore[arg-type]
                           mean=(0.0,) * channels, std=(1.0,) * channels, augment=augment)
        return cls(info=info, train_x=train_x, train_y=train_y, test_x=tx, test_y=ty,
                   client_train=[torch.as_tensor(p, dtype=torch.int64) for p in parts],
                   client_test=[torch.as_tensor(p, dtype=torch.int64) for p in test_parts], augment=augment, name=name)

    @classmethod
    def from_datasets(
        cls,
        clients: Sequence[Dataset],
        test: Dataset | tuple[torch.Tensor, torch.Tensor] | Sequence[Dataset],
        *,
        name: str = "datasets",
        num_classes: int | None = None,
        augment: bool = False,
        seed: int = 0,
    ) -> "FederatedData":
        """Your clients' map-style ``torch.utils.data.Dataset`` objects as a federation, as
        :meth:`from_tensors` makes one: ``clients[k]`` yields client k's ``(x, y)`` samples, ``x``
        a float tensor (``C×H×W`` or ``F``) and ``y`` an integer label; ``test`` likewise (or a
        pair of tensors), or a list of one test dataset per client (each client's own test data,
        as :meth:`from_tensors` takes it).

        Each dataset is read once, here, sample by sample, into tensors held in memory: a
        client's batches are then one ``index_select`` with no per-sample Python (the engine's
        speed comes from that), and the run's content fingerprint covers exactly what trained.
        So a dataset's transform runs once per sample: make it turn samples into normalised
        tensors (e.g. ``ToTensor()`` and ``Normalize``), and leave random augmentation to
        ``augment=True`` (fednorm's crop + flip per batch), since a random transform here would
        be drawn once and frozen.

        Args:
            clients: one map-style dataset per client.
            test: one global test dataset (or a pair of tensors ``(x, y)``), or a list of one
                test dataset per client.
            name, num_classes, augment, seed: as :meth:`from_tensors`'.

        Returns:
            A :class:`FederatedData`, as :meth:`from_tensors` returns it.

        Raises:
            DatasetError: a dataset that is not map-style, a sample that is not ``(x, y)`` with a
                tensor (or NumPy array) ``x``, or shapes, dtypes and labels that do not fit
                together (one line, naming the client and the sample).

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> from fednorm import FederatedData
            >>> g = torch.Generator().manual_seed(0)
            >>> train = [TensorDataset(torch.randn(10, 4, generator=g) + k, torch.arange(10) % 2) for k in range(2)]
            >>> test = [TensorDataset(torch.randn(4, 4, generator=g) + k, torch.arange(4) % 2) for k in range(2)]
            >>> data = FederatedData.from_datasets(train, test)  # each client scored on its own test data
            >>> data.num_clients, [len(ix) for ix in data.client_train], [len(ix) for ix in data.client_test]
            (2, [10, 10], [4, 4])
        """
        from ..errors import DatasetError

        if not isinstance(clients, Sequence) or isinstance(clients, Dataset) or not clients:
            raise DatasetError("from_datasets needs a list of datasets, one per client (clients=[dataset, ...])")
        read = [_read_dataset(ds, f"client {k}") for k, ds in enumerate(clients)]
        shape = next((x.shape[1:] for x, _ in read if x is not None), None)
        if shape is None:
            raise DatasetError("from_datasets: every client's dataset is empty")
        pairs = [(x, y) if x is not None else (torch.empty(0, *shape), torch.empty(0, dtype=torch.int64)) for x, y in read]
        if isinstance(test, (list, tuple)) and len(test) == len(clients) and all(isinstance(t, Dataset) for t in test):
            test_pair = []  # one test dataset per client: each client's own test data
            for k, ds in enumerate(test):
                tx, ty = _read_dataset(ds, f"client {k}'s test data")
                test_pair.append((tx, ty) if tx is not None else (torch.empty(0, *shape), torch.empty(0, dtype=torch.int64)))
        elif isinstance(test, (tuple, list)):
            test_pair = test
        else:
            tx, ty = _read_dataset(test, "test")
            test_pair = (tx, ty) if tx is not None else (torch.empty(0, *shape), torch.empty(0, dtype=torch.int64))
        return cls.from_tensors(pairs, test_pair, name=name, num_classes=num_classes, augment=augment, seed=seed)  # type: ignore[arg-type]

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> "FederatedData":
        """The data on ``device`` (samples in ``dtype``), like ``Tensor.to``: ``self`` when
        nothing moves, else a new object (sharing the tensors that need no move). The caller's
        object keeps its device and dtype: a float64 run must not change the data, and so the
        fingerprint, of the object a user passes on to the next run."""
        moved = dict(
            train_x=self.train_x.to(device=device, dtype=dtype or self.train_x.dtype),
            test_x=self.test_x.to(device=device, dtype=dtype or self.test_x.dtype),
            train_y=self.train_y.to(device),
            test_y=self.test_y.to(device),
            client_train=[ix.to(device) for ix in self.client_train],
            client_test=[ix.to(device) for ix in self.client_test],
        )
        if self.client_val is not None:
            moved["client_val"] = [ix.to(device) for ix in self.client_val]
        same = all(v is getattr(self, k) if isinstance(v, torch.Tensor) else all(a is b for a, b in zip(v, getattr(self, k)))
                   for k, v in moved.items())
        return self if same else dataclasses.replace(self, **moved)


def _read_dataset(ds: object, where: str) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A map-style dataset's samples as ``(x, y)`` tensors (``x`` None when it is empty)."""
    from ..errors import DatasetError

    if isinstance(ds, IterableDataset) or not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise DatasetError(f"{where}: expected a map-style torch Dataset (with __len__ and __getitem__), got "
                           f"{type(ds).__name__}; read an iterable one into tensors and use FederatedData.from_tensors")
    xs: list[torch.Tensor] = []
    ys: list[object] = []
    for i in range(len(ds)):  # type: ignore[arg-type]
        item = ds[i]  # type: ignore[index]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise DatasetError(f"{where}: sample {i} is a {type(item).__name__}, expected a pair (x, y)")
        x, y = item
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not isinstance(x, torch.Tensor):
            raise DatasetError(f"{where}: sample {i}'s x is a {type(x).__name__}, not a tensor; give the dataset a transform "
                               "that returns one (e.g. torchvision.transforms.ToTensor())")
        if xs and x.shape != xs[0].shape:
            raise DatasetError(f"{where}: sample {i} has shape {tuple(x.shape)}, sample 0 {tuple(xs[0].shape)}; resize in "
                               "the dataset's transform so that every sample has one shape")
        if isinstance(y, (torch.Tensor, np.ndarray)):
            if (y.size if isinstance(y, np.ndarray) else y.numel()) != 1:
                raise DatasetError(f"{where}: sample {i}'s label has shape {tuple(y.shape)}, expected one class index")
            y = y.reshape(()) if isinstance(y, torch.Tensor) else torch.from_numpy(np.asarray(y).reshape(()))
        xs.append(x)
        ys.append(y)
    if not xs:
        return None, torch.empty(0, dtype=torch.int64)
    try:
        labels = torch.stack([torch.as_tensor(y) for y in ys])
    except (TypeError, RuntimeError, ValueError) as exc:
        raise DatasetError(f"{where}: labels must be class indices (int); got {type(ys[0]).__name__} ({exc})") from None
    return torch.stack(xs), labels


def build_federated_data(
    dataset: str,
    *,
    num_clients: int,
    partition_name: str,
    seed: int,
    data_dir: str | None = None,
    download: bool = False,
    augment: bool | None = None,
    input_norm: str | Mapping[str, Sequence[float]] = "dataset",
    dataset_args: Mapping[str, object] | None = None,
    **partition_params: object,
) -> FederatedData:
    """Load ``dataset``, split its training set with ``partition_name`` and build client test splits.

    ``dataset_args``: the dataset's own options (e.g. the ``domains`` dataset's ``domains``,
    ``image_size``, ``channels``). ``input_norm``: ``"dataset"`` standardises with the dataset's own per-channel statistics,
    ``"none"`` leaves pixels in [0, 1], ``{"mean": [...], "std": [...]}`` uses those.

    Raises:
        PartitionError: the partition is impossible (e.g. more clients than samples).
        DatasetError: the files are missing or corrupt.
    """
    from .provenance import is_user_dataset, user_data_error

    if is_user_dataset(dataset):
        raise user_data_error(dataset)
    options = dict(dataset_args or {})
    train = load_dataset(dataset, data_dir, train=True, download=download, **options)
    test = load_dataset(dataset, data_dir, train=False, download=download, **options)
    info = train.info
    if num_clients > len(train):
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {len(train)} training samples of '{dataset}'"
        )
    domains = getattr(train, "domains", None)
    if domains is not None:  # multi-source data: the domains partition needs the sources
        from .domains_dataset import warn_missing

        if partition_name == "domains":
            warn_missing(train, partition_params.get("sources"))
        partition_params = {"domains": domains, "domain_names": train.domain_names, **partition_params}
    try:
        parts = partition(partition_name, train.targets, num_clients, seed=seed, **partition_params)
    except PartitionError as exc:
        where = getattr(train, "domain_where", {})
        small = next((n for n in where if f"'{n}'" in str(exc)), None) if "smallest source" in str(exc) else None
        if small is not None:
            raise PartitionError(f"{exc}; or add samples to domain '{small}' ({where[small]})") from None
        if "in sources" in str(exc) and dataset != "domains":  # a domain of one's own beside a benchmark's
            raise PartitionError(f"{exc}. To add a domain of your own, list the domains in the 'domains' dataset, e.g. "
                                 f"dataset_args: {{domains: {{mnist: '{dataset}:mnist', mine: path/to/mine}}}} (docs/data.md)") from None
        raise
    hist = label_histogram(train.targets, parts, info.num_classes)
    # one source per client (feature shift): tested on its own source; a single-source dataset
    # under a label partition keeps label-matched test splits
    shifted = domains is not None and (partition_name == "domains" or len(np.unique(domains)) > 1)
    owners = client_domains(domains, parts) if shifted else None
    if owners is not None and partition_name == "domain_labels":  # label shift within each domain: matched tests
        test_parts = split_like_by_domain(test.targets, test.domains, owners, hist, seed=seed)
    elif owners is not None:
        test_parts = split_by_domain(test.domains, owners, seed=seed)
    elif shifted and partition_name == "domains":  # one client pooling sources: tested on their test sets
        held = np.unique(np.asarray(domains)[np.concatenate(parts)])
        test_parts = [np.flatnonzero(np.isin(test.domains, held)) if len(p) else np.empty(0, np.int64) for p in parts]
    else:
        test_parts = split_like(test.targets, hist, seed=seed)
    # Convert only the training samples some client holds (a domains split uses a fraction).
    used = np.unique(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])) if parts else np.empty(0, np.int64)
    if len(used) < len(train):
        remap = np.full(len(train), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        parts = [remap[np.asarray(p, dtype=np.int64)] for p in parts]
        train.data, train.targets = train.data[used], train.targets[used]
    test_domains = None if domains is None else np.asarray(test.domains)
    if shifted and partition_name == "domains" or owners is not None:  # the global test set: the clients' sources
        used_test = np.unique(np.concatenate(test_parts))
        if len(used_test) < len(test):
            remap = np.full(len(test), -1, dtype=np.int64)
            remap[used_test] = np.arange(len(used_test))
            test_parts = [remap[p] for p in test_parts]
            test.data, test.targets = test.data[used_test], test.targets[used_test]
            test_domains = test_domains[used_test]
    # "dataset": each split standardised with its own info's statistics (dataset_to_tensors' default)
    mean, std = (None, None) if input_norm == "dataset" else input_norm_values(input_norm, info)
    train_x, train_y = dataset_to_tensors(train, mean, std)
    test_x, test_y = dataset_to_tensors(test, mean, std)
    return FederatedData(
        info=info,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        client_train=[torch.as_tensor(p, dtype=torch.int64) for p in parts],
        client_test=[torch.as_tensor(p, dtype=torch.int64) for p in test_parts],
        augment=info.augment if augment is None else augment,
        domain_names=list(train.domain_names) if domains is not None else None,
        client_domain=owners,
        test_domain=None if test_domains is None else torch.as_tensor(test_domains, dtype=torch.int64),
    )


@functools.lru_cache(maxsize=4)
def _cached(dataset: str, num_clients: int, partition_name: str, seed: int, data_dir: str | None, params: tuple) -> FederatedData:
    kwargs = dict(params)
    if isinstance(kwargs.get("dataset_args"), str):  # hashable form (see cached_federated_data)
        import json

        kwargs["dataset_args"] = json.loads(kwargs["dataset_args"])
    return build_federated_data(dataset, num_clients=num_clients, partition_name=partition_name, seed=seed, data_dir=data_dir, **kwargs)


def cached_federated_data(
    dataset: str, *, num_clients: int, partition_name: str, seed: int, data_dir: str | None = None, **partition_params: object
) -> FederatedData:
    """:func:`build_federated_data`, memoised per process (for worker processes that serve many
    clients, e.g. Flower's simulation actors). Treat the result as read-only."""
    if isinstance(partition_params.get("dataset_args"), Mapping):
        import json

        partition_params = {**partition_params, "dataset_args": json.dumps(partition_params["dataset_args"], sort_keys=True)}
    return _cached(dataset, num_clients, partition_name, seed, data_dir, tuple(sorted(partition_params.items())))


def federated_data_from_config(config: object) -> FederatedData:
    """:func:`build_federated_data` with the data and partition fields of an ``ExperimentConfig``."""
    from .provenance import data_recipe

    c = config
    data = build_federated_data(
        c.dataset,  # type: ignore[attr-defined]
        num_clients=c.num_clients,  # type: ignore[attr-defined]
        partition_name=c.partition,  # type: ignore[attr-defined]
        seed=c.seed,  # type: ignore[attr-defined]
        data_dir=c.data_dir,  # type: ignore[attr-defined]
        download=c.download,  # type: ignore[attr-defined]
        augment=getattr(c, "augment", None),
        input_norm=getattr(c, "input_norm", "dataset"),
        dataset_args=getattr(c, "dataset_args", None),
        **{  # partition_args may repeat a field for a partitioner that is not fednorm's (flwr:...)
            "alpha": c.alpha,  # type: ignore[attr-defined]
            "classes_per_client": c.classes_per_client,  # type: ignore[attr-defined]
            "gamma": c.gamma,  # type: ignore[attr-defined]
            "min_size": c.min_size,  # type: ignore[attr-defined]
            **c.partition_args,  # type: ignore[attr-defined]
        },
    )
    data.recipe = data_recipe(config)
    return data


def input_norm_values(input_norm: str | Mapping[str, Sequence[float]], info: DatasetInfo) -> tuple[Sequence[float], Sequence[float]]:
    """The per-channel ``(mean, std)`` an ``input_norm`` setting standardises with: the dataset's
    own (``"dataset"``), none (``"none"``: pixels in [0, 1]) or the given ones."""
    if input_norm == "dataset":
        return info.mean, info.std
    if input_norm == "none":
        return (0.0,) * info.in_channels, (1.0,) * info.in_channels
    return input_norm["mean"], input_norm["std"]  # type: ignore[index]


def crop_fill_values(config: object, data: FederatedData) -> tuple[float, ...] | None:
    """The random crop's padding value per channel for ``config.crop_fill``: None for ``zero``;
    for ``black``, a black pixel as ``data``'s normalisation turned it (the normalisation is
    known only for data built from a config: tensors a user passes in are refused)."""
    from ..errors import ConfigError
    from .transforms import pixel_value

    if getattr(config, "crop_fill", "zero") == "zero":
        return None
    recipe = data.recipe
    if recipe is None:
        raise ConfigError("crop_fill: black needs the normalisation of the training tensors, which fednorm knows only for "
                          "data it built from the config; pad your tensors' crops yourself, or keep crop_fill: zero")
    return pixel_value(0, *input_norm_values(recipe.get("input_norm", "dataset"), data.info))


#: Recipe fields a repartition may change: they decide only which client holds which sample.
_SPLIT_FIELDS = SPLIT_FIELDS


def repartition(data: FederatedData, config: object) -> FederatedData | None:
    """``config``'s federation over ``data``'s tensors: the same samples (shared, not copied), split
    as ``config`` splits them; equal to :func:`federated_data_from_config` of ``config``. None when
    ``config`` needs other samples (another dataset, normalisation or augmentation) or the split
    depends on more than the labels (multi-source data). Stacked runs of several seeds hold one
    copy of the dataset this way."""
    from .provenance import data_recipe

    if data.recipe is None or data.domain_names is not None:
        return None
    wanted = data_recipe(config)
    if any(wanted[k] != v for k, v in data.recipe.items() if k not in _SPLIT_FIELDS):
        return None
    c = config
    params = {"alpha": c.alpha, "classes_per_client": c.classes_per_client, "gamma": c.gamma,  # type: ignore[attr-defined]
              "min_size": c.min_size, **c.partition_args}  # type: ignore[attr-defined]
    targets = data.train_y.cpu().numpy()
    parts = partition(c.partition, targets, c.num_clients, seed=c.seed, **params)  # type: ignore[attr-defined]
    hist = label_histogram(targets, parts, data.num_classes)
    test_parts = split_like(data.test_y.cpu().numpy(), hist, seed=c.seed)  # type: ignore[attr-defined]
    return FederatedData(info=data.info, train_x=data.train_x, train_y=data.train_y, test_x=data.test_x, test_y=data.test_y,
                         client_train=[torch.as_tensor(p, dtype=torch.int64) for p in parts],
                         client_test=[torch.as_tensor(p, dtype=torch.int64) for p in test_parts],
                         augment=data.augment, name=data.name, recipe=wanted)


def _check_pair(x: torch.Tensor, y: torch.Tensor, who: str, shape: Any = None) -> None:
    """One line on samples and labels that do not fit together (``shape``: the samples' shape so far)."""
    from ..errors import DatasetError

    if x.dim() not in (2, 4) or y.dim() != 1 or len(x) != len(y):
        raise DatasetError(f"{who}: x must be N×C×H×W or N×F and y N labels; got x {tuple(x.shape)}, y {tuple(y.shape)}")
    if not x.is_floating_point() or y.is_floating_point() or y.dtype == torch.bool:
        raise DatasetError(f"{who}: x must be float and y integer labels; got {x.dtype} and {y.dtype}")
    if shape is not None and x.shape[1:] != shape:
        raise DatasetError(f"{who}: samples of shape {tuple(x.shape[1:])}, client 0's are {tuple(shape)}")


def _per_client_tests(test: Any, num_clients: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """``test`` as one ``(x, y)`` per client, or None when it is one global pair (or absent)."""
    from ..errors import DatasetError

    if test is None or not isinstance(test, (tuple, list)) or not all(isinstance(t, (tuple, list)) for t in test):
        return None  # one global pair (checked as such), or nothing
    if len(test) != num_clients:
        raise DatasetError(f"test: {len(test)} test sets for {num_clients} clients; give one (x, y) per client, or one "
                           "global pair")
    for k, pair in enumerate(test):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair)):
            raise DatasetError(f"client {k}'s test data: expected a pair of tensors (x, y), got {type(pair).__name__}")
    return [(p[0], p[1]) for p in test]
