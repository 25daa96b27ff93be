"""Client partitioners: split a labelled dataset into per-client index sets.

Every partitioner is a pure function ``f(labels, num_clients, *, seed, ...)`` that returns one
sorted ``int64`` index array per client. It draws only from its own
``np.random.default_rng(seed)``, never the global RNG, and validates its arguments up front,
raising :class:`~fednorm.errors.PartitionError` with the argument name, the bad value and what
was expected. Work is bounded: no partitioner loops on random redraws without a cap. The schemes
are the non-IID generators of the papers fednorm reproduces: IID, the
per-class Dirichlet label skew (HBN, LN/FN, FBN App. C), k classes per client (LN/FN
``class_part``, FedTAN's class ring), FBN's γ-similarity (from SCAFFOLD) and quantity skew
(NIID-Bench). They are registered in :data:`PARTITIONS` and dispatched by :func:`partition`, which
passes each function only the parameters it accepts, so one config can hold every knob.
:func:`label_histogram` and :func:`describe` report a split; :func:`split_like` cuts a test set
with each client's training label mix, for per-client evaluation (LN/FN paper, FedBN).

Layout: dispatch and reports here; the registry and the argument checks every partitioner shares
in :mod:`~fednorm.data.partition_base`; the partitioners in :mod:`~fednorm.data.partition_label`
and :mod:`~fednorm.data.partition_domain`, which import only the base (this module imports them,
so they are registered and ``from fednorm.data.partition import dirichlet`` works), and Flower's by
name (``flwr:<Partitioner>``, :mod:`~fednorm.data.flwr_partition`).
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from ..config_roles import PARTITION_FIELDS
from ..errors import PartitionError
from ..registry import normalize_name
from .partition_base import (
    PARTITIONS,
    Partitioner,
    _apportion,
    _check_labels,
    _check_seed,
    _class_indices,
    _finish,
    _is_int,
    register_partition,
)
from .partition_domain import client_domains, domains, split_by_domain
from .partition_domain_label import domain_labels
from .partition_label import classes, dirichlet, dirichlet_client, gamma, iid, quantity

__all__ = [
    "PARTITIONS",
    "register_partition",
    "list_partitions",
    "get_partition",
    "partition",
    "check_partition_args",
    "iid",
    "dirichlet",
    "dirichlet_client",
    "classes",
    "gamma",
    "quantity",
    "domains",
    "domain_labels",
    "client_domains",
    "split_by_domain",
    "label_histogram",
    "split_like",
    "split_like_by_domain",
    "describe",
]

# Arguments every partitioner takes positionally or by the fixed protocol; never forwarded from params.
_PROTOCOL_ARGS = ("labels", "num_clients", "seed")


# --------------------------------------------------------------------------------------------
# Registry access
# --------------------------------------------------------------------------------------------


def list_partitions(include: str | Sequence[str] | None = None, exclude: str | Sequence[str] | None = None) -> list[str]:
    """Sorted names of the registered partitioners, optionally filtered by fnmatch patterns."""
    return PARTITIONS.list(include, exclude)


def get_partition(name: str) -> Partitioner:
    """The partitioner function registered under ``name`` (case-insensitive, ``-`` == ``_``).

    Raises:
        UnknownNameError: if no partitioner has that name; the message lists the valid names.
    """
    return PARTITIONS.get_builder(name)


def _keyword_params(fn: Partitioner) -> tuple[dict[str, inspect.Parameter], bool]:
    """The forwardable parameters of ``fn`` and whether it takes ``**kwargs``."""
    sig = inspect.signature(fn)
    params = {
        n: p
        for n, p in sig.parameters.items()
        if n not in _PROTOCOL_ARGS and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return params, var_kw


# Config fields of their own (ExperimentConfig), always forwarded; never keys of partition_args.
_CONFIG_FIELDS = PARTITION_FIELDS
# Supplied by the dataset (multi-source data), never by the user.
_DATA_ARGS = ("domains", "domain_names")


def check_partition_args(name: str, args: Mapping[str, Any]) -> None:
    """Raise :class:`PartitionError` for a ``partition_args`` key that partitioner ``name`` ignores.

    ``partition_args: {mode: ring}`` with ``partition: dirichlet`` would be recorded in the run's
    config and do nothing; like ``method_args``, such a key is an error. The message names the
    partitioners that do take the key, or the closest key of this one. An unknown ``name`` is left
    to the registry's own error.
    """
    try:
        fn = get_partition(name)
    except ValueError:
        return
    accepted, var_kw = _keyword_params(fn)
    if var_kw:
        return
    own = sorted(k for k in accepted if k not in _CONFIG_FIELDS and k not in _DATA_ARGS)
    label = normalize_name(name)
    for key in args:
        if key in _CONFIG_FIELDS:
            raise PartitionError(
                f"partition_args: '{key}' is a setting of its own; pass --{key.replace('_', '-')} (YAML: {key}: ...) instead"
            )
        if key in own:
            continue
        takers = [other for other in PARTITIONS.list() if other != label and key in _keyword_params(PARTITIONS.get_builder(other))[0]]
        takes = f" ('{key}' belongs to the {', '.join(repr(t) for t in takers)} partition)" if takers else ""
        close = difflib.get_close_matches(str(key), own, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        options = ", ".join(own) if own else "none"
        raise PartitionError(f"partition_args: partition '{label}' takes no option '{key}'{takes}{hint} (its options: {options})")


def partition(name: str, labels: Any, num_clients: int, *, seed: int, **params: Any) -> list[np.ndarray]:
    """Split ``labels`` among ``num_clients`` clients with the partitioner registered as ``name``.

    Only the entries of ``params`` that the chosen partitioner accepts are passed on, so a config
    can hold the knobs of every scheme (``alpha`` is ignored by ``iid``, ``gamma`` by
    ``dirichlet``, ...). ``None`` values are dropped so that the function's defaults apply (as
    :meth:`Registry.build` does). A key that *no* registered partitioner accepts is most likely a
    typo and triggers a warning naming the closest valid key.

    Args:
        name: registry key, e.g. ``"dirichlet"`` (see :func:`list_partitions`).
        labels: 1-D array of non-negative integer class labels, one per sample.
        num_clients: number of clients, ``1 <= num_clients <= len(labels)``.
        seed: seed of the partitioner's own ``np.random.default_rng``.
        **params: scheme parameters (``alpha``, ``classes_per_client``, ``gamma``, ``min_size``, ...).

    Returns:
        One sorted ``int64`` array of sample indices per client.

    Raises:
        UnknownNameError: for an unknown ``name``.
        PartitionError: for a missing required parameter or any invalid value.

    Examples:
        >>> parts = partition("dirichlet", labels, 100, seed=0, alpha=0.1, gamma=0.5)  # gamma ignored
    """
    fn = get_partition(name)
    accepted, var_kw = _keyword_params(fn)
    given = {k: v for k, v in params.items() if v is not None}

    known: set[str] = set(given) if var_kw else set()  # a partitioner taking any option (flwr:...)
    for other in PARTITIONS.list():
        other_params, other_var_kw = _keyword_params(PARTITIONS.get_builder(other))
        if other_var_kw:
            known = set(given)  # some partitioner accepts anything: no key can be called a typo
            break
        known.update(other_params)
    for key in sorted(set(given) - known):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        warnings.warn(
            f"partition parameter '{key}' is accepted by no registered partitioner and is ignored.{hint}",
            stacklevel=2,
        )

    kwargs = given if var_kw else {k: v for k, v in given.items() if k in accepted}
    missing = [
        n for n, p in accepted.items() if p.default is inspect.Parameter.empty and n not in kwargs
    ]
    if missing:
        raise PartitionError(
            f"partition '{normalize_name(name)}' requires the parameter(s) {', '.join(repr(m) for m in missing)}, "
            f"which were not given (or were None)"
        )
    return fn(labels, num_clients, seed=seed, **kwargs)


# --------------------------------------------------------------------------------------------
# Reports and test splits
# --------------------------------------------------------------------------------------------


def label_histogram(labels: Any, parts: Sequence[Any], num_classes: int | None = None) -> np.ndarray:
    """Per-client label counts, the common report of every partition.

    Args:
        labels: 1-D array of non-negative integer labels.
        parts: one index array per client (as returned by a partitioner).
        num_classes: number of columns (default: ``max(labels) + 1``).

    Returns:
        ``int64`` array of shape ``[num_clients, num_classes]``; entry (i, c) counts client i's
        samples of class c.

    Raises:
        PartitionError: if an index is out of range or a label is ``>= num_classes``.
    """
    labels = _check_labels(labels)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    elif not _is_int(num_classes) or num_classes < 0:
        raise PartitionError(f"num_classes must be a non-negative integer, got {num_classes!r}")
    hist = np.zeros((len(parts), int(num_classes)), dtype=np.int64)
    for i, part in enumerate(parts):
        idx = np.asarray(part, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(labels)):
            raise PartitionError(
                f"parts[{i}] holds indices outside [0, {len(labels)}): min {int(idx.min())}, max {int(idx.max())}"
            )
        ys = labels[idx]
        if ys.size and ys.max() >= num_classes:
            raise PartitionError(f"num_classes={num_classes} but parts[{i}] holds label {int(ys.max())}")
        hist[i] = np.bincount(ys, minlength=int(num_classes))
    return hist


def _check_hist(hist: Any, arg: str) -> np.ndarray:
    arr = np.asarray(hist)
    if arr.ndim != 2 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise PartitionError(
            f"{arg} must be a 2-D integer array [num_clients, num_classes], got shape {tuple(arr.shape)} "
            f"and dtype {arr.dtype}"
        )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise PartitionError(f"{arg} must hold non-negative counts, got minimum {int(arr.min())}")
    return arr


def split_like(test_labels: Any, train_hist: Any, *, seed: int) -> list[np.ndarray]:
    """Cut a test set into per-client test splits with each client's training label mix.

    For every class c the test indices of c are shuffled and divided among the clients in
    proportion to their training counts ``train_hist[:, c]``, with largest-remainder rounding
    (ties broken at random), so every test index of a class held by some client is used exactly
    once. Test samples of classes no client holds (including labels ``>= train_hist.shape[1]``)
    are left out. This is the per-client evaluation of the LN/FN paper (Zhang et al., 2024, App. C.2–C.3; in
    the authors' released code each client's test split has its train split's label distribution) and of
    FedBN-style personalised evaluation. [code≠here] LN/FN's code scales train shares by a fixed
    test/train ratio with rounding fix-ups; proportional apportioning gives the same split up to
    rounding and always uses the whole test set.

    Args:
        test_labels: 1-D array of non-negative integer test labels.
        train_hist: ``[num_clients, num_classes]`` training label counts (see :func:`label_histogram`).
        seed: seed of the function's ``np.random.default_rng``.

    Returns:
        One sorted ``int64`` array of test indices per client; the arrays are disjoint.

    Raises:
        PartitionError: on invalid arguments.
    """
    test_labels = _check_labels(test_labels, "test_labels")
    hist = _check_hist(train_hist, "train_hist")
    rng = np.random.default_rng(_check_seed(seed))
    num_clients, num_classes = hist.shape
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    present, by_class = _class_indices(test_labels)
    for c, idx in zip(present, by_class):
        if c >= num_classes or hist[:, c].sum() == 0:
            continue
        counts = _apportion(len(idx), hist[:, c], rng)
        idx = rng.permutation(idx)
        for client, piece in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            if piece.size:
                chunks[client].append(piece)
    return _finish([np.concatenate(c) if c else np.empty(0, np.int64) for c in chunks])


def split_like_by_domain(test_labels: Any, test_domains: Any, client_domain: Sequence[int], train_hist: Any, *,
                         seed: int) -> list[np.ndarray]:
    """:func:`split_like` within each domain: a client's test split comes from its own domain's test
    samples, with its training label mix (the LN/FN paper's PACS clients, ``domain_labels``).

    For every domain held by some client, that domain's test samples are cut among its clients
    by :func:`split_like` with their rows of ``train_hist``; test samples of domains no client
    holds are left out. The arrays are disjoint and sorted.
    """
    labels = _check_labels(test_labels, "test_labels")
    doms = _check_labels(test_domains, "test_domains")
    hist = _check_hist(train_hist, "train_hist")
    if len(doms) != len(labels) or len(client_domain) != len(hist):
        raise PartitionError(f"test_domains has {len(doms)} entries for {len(labels)} test labels; client_domain "
                             f"{len(client_domain)} for {len(hist)} clients")
    rng = np.random.default_rng(_check_seed(seed))
    owner = np.asarray(client_domain, dtype=np.int64)
    parts = [np.empty(0, np.int64) for _ in client_domain]
    for d in np.unique(owner):
        clients = np.flatnonzero(owner == d)
        idx = np.flatnonzero(doms == d)
        pieces = split_like(labels[idx], hist[clients], seed=int(rng.integers(0, 2**31 - 1)))
        for c, piece in zip(clients, pieces):
            parts[c] = idx[piece]
    return _finish(parts)


def describe(hist: Any, *, max_clients: int | None = 50, max_classes: int | None = 20) -> str:
    """A compact text table of a per-client label histogram, for the CLI.

    Rows are clients, columns are classes, followed by the client's total ``n`` and the number of
    classes it holds ``k``; a last row holds the class totals. Beyond ``max_clients`` rows or
    ``max_classes`` columns the table is cut and an ellipsis marks the cut (totals still cover
    everything); ``None`` disables a limit.

    Args:
        hist: ``[num_clients, num_classes]`` integer counts (see :func:`label_histogram`).
        max_clients: most client rows shown (default: 50).
        max_classes: most class columns shown (default: 20).

    Returns:
        The table as a multi-line string.

    Examples:
        >>> print(describe(np.array([[3, 0], [1, 2]])))
        client  c0  c1  |  n  k
             0   3   0  |  3  1
             1   1   2  |  3  2
         total   4   2  |  6  2
    """
    hist = _check_hist(hist, "hist")
    num_clients, num_classes = hist.shape
    show_rows = num_clients if max_clients is None else min(num_clients, max_clients)
    show_cols = num_classes if max_classes is None else min(num_classes, max_classes)
    cut_rows, cut_cols = show_rows < num_clients, show_cols < num_classes

    header = ["client"] + [f"c{j}" for j in range(show_cols)] + (["..."] if cut_cols else []) + ["|", "n", "k"]

    def row(name: str, counts: np.ndarray) -> list[str]:
        cells = [str(int(v)) for v in counts[:show_cols]]
        return [name] + cells + (["..."] if cut_cols else []) + ["|", str(int(counts.sum())), str(int((counts > 0).sum()))]

    rows = [header] + [row(str(i), hist[i]) for i in range(show_rows)]
    if cut_rows:
        rows.append(["..."] * len(header))
    rows.append(row("total", hist.sum(axis=0)))
    widths = [max(len(r[j]) for r in rows) for j in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _flwr(rest: str) -> Partitioner:
    from .flwr_partition import flwr_partitioner  # needs the hf extra only when used

    return flwr_partitioner(rest)


PARTITIONS.add_prefix("flwr", _flwr)  # --partition flwr:DirichletPartitioner (fednorm/data/flwr_partition.py)


