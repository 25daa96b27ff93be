"""Client partitioners: split a labelled dataset into per-client index sets.

Every partitioner is a pure function ``f(labels, num_clients, *, seed, ...)`` that returns one
sorted ``int64`` index array per client. It draws only from its own
``np.random.default_rng(seed)``, never the global RNG, and validates its arguments up front,
raising :class:`~fednorm.errors.PartitionError` with the argument name, the bad value and what
was expected. Work is bounded: no partitioner loops on random redraws without a cap. The schemes
are the non-IID generators of the papers fednorm reproduces (spec/all_methods.md §E): IID, the
per-class Dirichlet label skew (HBN, LN/FN, FBN App. C), k classes per client (LN/FN
``class_part``, FedTAN's class ring), FBN's γ-similarity (from SCAFFOLD) and quantity skew
(NIID-Bench). They are registered in :data:`PARTITIONS` and dispatched by :func:`partition`, which
passes each function only the parameters it accepts, so one config can hold every knob.
:func:`label_histogram` and :func:`describe` report a split; :func:`split_like` cuts a test set
with each client's training label mix, for per-client evaluation (LN/FN paper, FedBN).
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import warnings
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from ..errors import PartitionError
from ..registry import Registry, normalize_name

__all__ = [
    "PARTITIONS",
    "register_partition",
    "list_partitions",
    "get_partition",
    "partition",
    "check_partition_args",
    "iid",
    "dirichlet",
    "classes",
    "gamma",
    "quantity",
    "domains",
    "client_domains",
    "split_by_domain",
    "label_histogram",
    "split_like",
    "describe",
]

Partitioner = Callable[..., "list[np.ndarray]"]

PARTITIONS: Registry[Partitioner] = Registry("partition")
register_partition = PARTITIONS.register

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
_CONFIG_FIELDS = ("alpha", "classes_per_client", "gamma", "min_size")
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
# Validation helpers
# --------------------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _check_labels(labels: Any, arg: str = "labels") -> np.ndarray:
    """Validate and return ``labels`` as a 1-D int64 array."""
    try:
        arr = np.asarray(labels)
    except Exception as exc:  # e.g. a ragged list or a CUDA tensor
        raise PartitionError(f"{arg} must be a 1-D array of non-negative integers; could not convert it ({exc})") from None
    if arr.ndim != 1:
        raise PartitionError(f"{arg} must be 1-D (one label per sample), got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(
            f"{arg} must hold integers, got dtype {arr.dtype}; convert class labels with .astype(np.int64)"
        )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise PartitionError(f"{arg} must be non-negative class ids, got minimum {int(arr.min())}")
    return arr


def _check_num_clients(num_clients: Any, num_samples: int) -> int:
    if not _is_int(num_clients):
        raise PartitionError(f"num_clients must be an integer, got {num_clients!r} ({type(num_clients).__name__})")
    if num_clients <= 0:
        raise PartitionError(f"num_clients must be > 0, got {num_clients}")
    if num_clients > num_samples:
        raise PartitionError(
            f"num_clients must be <= the number of samples ({num_samples}), got {num_clients}; "
            "every client needs at least one sample to be possible"
        )
    return int(num_clients)


def _check_seed(seed: Any) -> int:
    if not _is_int(seed) or seed < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


# Below this, log(U)/alpha overflows float64 and the Dirichlet draw is meaningless; any alpha
# this small already gives every class (or all data) to one client.
_MIN_ALPHA = 1e-100


def _check_alpha(alpha: Any, arg: str = "alpha") -> float:
    if not _is_real(alpha) or not np.isfinite(alpha) or alpha <= 0:
        raise PartitionError(f"{arg} must be a finite real number > 0 (Dirichlet concentration), got {alpha!r}")
    if alpha < _MIN_ALPHA:
        raise PartitionError(f"{arg}={alpha!r} is too small to sample; use {arg} >= {_MIN_ALPHA:g} (already maximal skew)")
    return float(alpha)


def _check_nonneg_int(value: Any, arg: str) -> int:
    if not _is_int(value) or value < 0:
        raise PartitionError(f"{arg} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_min_size(min_size: Any, num_clients: int, num_samples: int) -> int:
    min_size = _check_nonneg_int(min_size, "min_size")
    if min_size * num_clients > num_samples:
        raise PartitionError(
            f"min_size={min_size} is impossible with num_clients={num_clients}: it needs "
            f"{min_size * num_clients} samples but labels has {num_samples}; lower min_size or num_clients"
        )
    return min_size


def _finish(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Sorted int64 copies of the client index arrays."""
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_indices(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Present classes (sorted) and, for each, its sample indices in dataset order."""
    order = np.argsort(labels, kind="stable")
    present, starts = np.unique(labels[order], return_index=True)
    return present, np.split(order, starts[1:])


def _sample_dirichlet(rng: np.random.Generator, alpha: float, size: tuple[int, int]) -> np.ndarray:
    """Rows ~ Dir(alpha·1), computed in log space so that tiny ``alpha`` never underflows.

    A Gamma(alpha) variate is Gamma(alpha + 1)·U^(1/alpha) with U ~ U(0, 1] independent
    (Marsaglia & Tsang 2000, §3), so log G = log Gamma(alpha + 1) + log(U)/alpha is finite for any
    alpha > 0. Normalising with a max-shifted softmax gives an exact Dirichlet draw without the
    all-zero rows (and NaN proportions) that ``rng.dirichlet`` / ``rng.gamma`` produce at
    alpha ≈ 1e-4 in float64.
    """
    log_g = np.log(np.maximum(rng.gamma(alpha + 1.0, size=size), np.finfo(float).tiny))
    log_g += np.log(1.0 - rng.random(size)) / alpha  # 1 - U lies in (0, 1]: log is finite
    log_g -= log_g.max(axis=-1, keepdims=True)
    p = np.exp(log_g)
    return p / p.sum(axis=-1, keepdims=True)


def _apportion(total: int, weights: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """Largest-remainder rounding: non-negative ints summing to ``total``, proportional to ``weights``.

    Integer weights are handled in exact integer arithmetic. Ties between equal remainders are
    broken at random with ``rng`` (so no client is favoured systematically), else by index.
    """
    weights = np.asarray(weights)
    if np.issubdtype(weights.dtype, np.integer):
        w = weights.astype(np.int64)
        wsum = int(w.sum())
        base = (w * total) // wsum
        rem = (w * total) % wsum  # exact remainders, comparable as integers
    else:
        quota = weights / weights.sum() * total
        base = np.floor(quota).astype(np.int64)
        rem = quota - base
    short = total - int(base.sum())
    if short > 0:
        if rng is not None:
            order = np.lexsort((rng.random(len(rem)), -rem))  # by remainder, ties at random
        else:
            order = np.argsort(-rem, kind="stable")
        base[order[:short]] += 1
    return base


# --------------------------------------------------------------------------------------------
# Partitioners
# --------------------------------------------------------------------------------------------


@register_partition("iid")
def iid(labels: Any, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Random equal split: shuffle all indices and cut them into ``num_clients`` near-equal parts.

    The IID baseline of every paper (e.g. FedTAN §6.1: "shuffle 50k, equal shares"). Client sizes
    differ by at most one sample.

    Args:
        labels: 1-D array of non-negative integer labels (only its length is used).
        num_clients: number of clients, ``1 <= num_clients <= len(labels)``.
        seed: seed of the partitioner's ``np.random.default_rng``.

    Returns:
        One sorted ``int64`` index array per client.

    Raises:
        PartitionError: on invalid arguments.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    rng = np.random.default_rng(_check_seed(seed))
    return _finish(np.array_split(rng.permutation(len(labels)), num_clients))


@register_partition("dirichlet")
def dirichlet(
    labels: Any,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    min_size: int = 1,
    max_retries: int = 10,
) -> list[np.ndarray]:
    """Per-class Dirichlet label skew: each class is spread over clients by q_c ~ Dir(alpha·1_K).

    For every class c the proportions q_c over the K clients are drawn from a symmetric Dirichlet
    and the (shuffled) indices of c are cut at ``floor(cumsum(q_c)·n_c)``. This is the scheme of
    Hsu et al. 2019 (arXiv:1909.06335) as used, per class, by HBN (spec/000_hbn.md §2.1,
    ``sampling.py``) and the LN/FN paper's ``label_shift`` (spec/003_ln_fn.md §2.1), and of
    Yurochkin et al. (arXiv:1905.12022), as in Flower's ``DirichletPartitioner``. Smaller
    ``alpha`` means more skew; client sizes are unequal and, at small alpha, may be tiny.

    ``min_size`` (not in the papers; from implementations such as Flower's) is guaranteed: a draw
    that leaves a client with fewer samples is redrawn at most ``max_retries`` times; if every draw
    fails, the draw with the smallest total deficit is repaired deterministically by moving samples
    from the currently largest clients (the tail of their index lists) to the deficient ones.
    Either way one warning says how many draws it took (one line, not one per draw). Hence the
    call never hangs, and it fails only when ``min_size * num_clients > len(labels)``.

    [code≠here] HBN's ``sampling.py`` and LN/FN's ``preprocess_vision.py`` hand out slices of each
    class in dataset order (no shuffle), and LN/FN rounds each share and gives the remainder to a
    random client; here each class is shuffled first, so a client's samples of a class are a
    random subset. Dirichlet proportions are sampled in log space (see ``_sample_dirichlet``), so
    ``alpha`` as small as 1e-4 gives valid, NaN-free proportions.

    FBN (spec/002_fbn.md §6) describes the per-*client* Hsu variant (q_i ~ Dir(alpha·p), equal
    client sizes); this function implements the per-class variant, which the spec also lists.

    Args:
        labels: 1-D array of non-negative integer labels.
        num_clients: number of clients K, ``1 <= K <= len(labels)``.
        alpha: Dirichlet concentration (HBN's φ, LN/FN's β), finite and > 0.
        seed: seed of the partitioner's ``np.random.default_rng``.
        min_size: least number of samples per client (default: 1); 0 allows empty clients.
        max_retries: redraws allowed before the deterministic repair (default: 10).

    Returns:
        One sorted ``int64`` index array per client; every index appears exactly once.

    Raises:
        PartitionError: on invalid arguments, or when ``min_size * num_clients > len(labels)``.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    alpha = _check_alpha(alpha)
    min_size = _check_min_size(min_size, num_clients, len(labels))
    max_retries = _check_nonneg_int(max_retries, "max_retries")
    rng = np.random.default_rng(_check_seed(seed))
    _, by_class = _class_indices(labels)

    best: list[np.ndarray] | None = None
    best_deficit = -1
    attempts = max_retries + 1
    for attempt in range(1, attempts + 1):
        props = _sample_dirichlet(rng, alpha, (len(by_class), num_clients))  # q_c, one row per class
        chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for q, idx in zip(props, by_class):
            idx = rng.permutation(idx)
            cuts = np.floor(np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
            for client, piece in enumerate(np.split(idx, np.clip(cuts, 0, len(idx)))):
                chunks[client].append(piece)
        parts = [np.concatenate(c) if c else np.empty(0, np.int64) for c in chunks]
        sizes = np.array([len(p) for p in parts])
        deficit = int(np.maximum(min_size - sizes, 0).sum())
        if deficit == 0:
            if attempt > 1:
                warnings.warn(
                    f"dirichlet: {attempt - 1} draw(s) left clients with fewer than min_size={min_size} samples and "
                    f"were redrawn; draw {attempt} gave every client enough. alpha={alpha:g} concentrates each class "
                    "on few clients: increase alpha, lower min_size or num_clients to avoid redraws",
                    stacklevel=2,
                )
            return _finish(parts)
        if best is None or deficit < best_deficit:
            best, best_deficit = parts, deficit

    assert best is not None
    parts = list(best)
    sizes = np.array([len(p) for p in parts])
    receivers = np.flatnonzero(sizes < min_size)
    for client in receivers:  # deterministic: fixed client order, largest donor first
        need = min_size - sizes[client]
        while need > 0:
            donor = int(np.argmax(sizes))  # has surplus: sum(sizes) >= K·min_size while a deficit remains
            take = int(min(need, sizes[donor] - min_size))
            parts[client] = np.concatenate([parts[client], parts[donor][len(parts[donor]) - take :]])
            parts[donor] = parts[donor][: len(parts[donor]) - take]
            sizes[donor] -= take
            sizes[client] += take
            need -= take
    warnings.warn(
        f"dirichlet: no draw of {attempts} gave every client min_size={min_size} samples; moved "
        f"{best_deficit} samples from the largest clients to {len(receivers)} deficient ones. This "
        f"slightly weakens the skew of alpha={alpha:g}; increase alpha or lower min_size/num_clients "
        "to avoid it",
        stacklevel=2,
    )
    return _finish(parts)


def _class_sets(
    num_classes: int, num_clients: int, k: int, mode: str, rng: np.random.Generator
) -> list[np.ndarray]:
    """Class positions held by each client: windows of length k on a (permuted) ring of classes."""
    if mode == "random":
        perm = rng.permutation(num_classes)
    else:
        perm = np.arange(num_classes)
    if mode == "ring":
        starts = [(c * num_classes) // num_clients for c in range(num_clients)]
    else:
        starts = [c * k for c in range(num_clients)]
    return [perm[(s + np.arange(k)) % num_classes] for s in starts]


@register_partition("classes")
def classes(
    labels: Any,
    num_clients: int,
    *,
    classes_per_client: int,
    seed: int,
    mode: Literal["random", "sequential", "ring"] = "random",
) -> list[np.ndarray]:
    """Pathological label skew: each client holds exactly ``classes_per_client`` (k) classes.

    With C the classes present in ``labels`` (sorted), client c holds the classes
    ``perm[(start_c + m) mod C]`` for m = 0..k−1, i.e. a window of k consecutive classes on a
    ring. Each class's indices are cut into equal contiguous chunks (``np.array_split``) among the
    clients holding it, in client order. Modes:

    - ``"random"`` (default): ``perm`` is a seeded permutation, ``start_c = c·k``, and each class
      is shuffled before it is cut.
    - ``"sequential"``: ``perm`` is the identity, ``start_c = c·k``, classes are cut in dataset
      order. k = 2 with 5 clients on 10 classes gives FedTAN's CIFAR-10/MNIST split {0,1}, {2,3},
      ... (spec/001_fedtan.md §4.1, the code's sort-and-chunk); k = 1 with C clients gives one
      whole class per client (LN/FN's and FBN's extreme case).
    - ``"ring"``: ``perm`` is the identity, ``start_c = floor(c·C/K)``, dataset order. This is
      FedTAN's Suppl. D ring (Fig. 5): with K = 5 clients on 10 classes, client c holds
      {2c, ..., 2c + k − 1} mod 10, so each class is held by k/2 clients. It equals
      ``"sequential"`` when k = C/K.

    Relation to LN/FN's ``class_part`` (spec/003_ln_fn.md §2.1) [code≠here]: ``class_part`` cuts
    each class into K·k/C chunks and lets each client draw k classes at random among those with
    chunks left, which can fail and needs another seed. Here the random class sets are k-windows
    of a random permutation: it never fails, every client gets exactly k distinct classes, and when
    C divides K·k each class is shared by exactly K·k/C clients, as in ``class_part``. For the
    paper's settings (1 or 2 classes/client on CIFAR-10 with 10 clients, 2 classes/50 clients and
    5 classes/20 clients on CIFAR-100) the chunk sizes are the same; the joint law of the class
    sets differs.

    A class held by no client (K·k < C) is dropped, with a warning. A class with fewer samples than
    holders leaves some holders without it (also warned).

    Args:
        labels: 1-D array of non-negative integer labels.
        num_clients: number of clients K, ``1 <= K <= len(labels)``.
        classes_per_client: k, ``1 <= k <=`` the number of classes present in ``labels``.
        seed: seed of the partitioner's ``np.random.default_rng``.
        mode: ``"random"``, ``"sequential"`` or ``"ring"`` (default: ``"random"``).

    Returns:
        One sorted ``int64`` index array per client; every index of a held class appears exactly
        once, indices of dropped classes appear nowhere.

    Raises:
        PartitionError: on invalid arguments.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    rng = np.random.default_rng(_check_seed(seed))
    if mode not in ("random", "sequential", "ring"):
        raise PartitionError(
            f"Unknown value {mode!r} for argument mode. Valid values are {{'random', 'sequential', 'ring'}}"
        )
    present, by_class = _class_indices(labels)
    num_classes = len(present)
    k = classes_per_client
    if not _is_int(k) or not 1 <= k <= num_classes:
        raise PartitionError(
            f"classes_per_client must be an integer between 1 and the number of classes present in "
            f"labels ({num_classes}), got {k!r}"
        )
    k = int(k)

    sets = _class_sets(num_classes, num_clients, k, mode, rng)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client, cls in enumerate(sets):
        for pos in cls:
            holders[pos].append(client)

    dropped = [int(present[j]) for j in range(num_classes) if not holders[j]]
    if dropped:
        shown = ", ".join(map(str, dropped[:10])) + (", ..." if len(dropped) > 10 else "")
        warnings.warn(
            f"classes: {len(dropped)} of {num_classes} classes ({shown}) are held by no client since "
            f"num_clients*classes_per_client = {num_clients * k} < {num_classes}; their samples are "
            "dropped. Increase classes_per_client or num_clients to use every class",
            stacklevel=2,
        )
    thin = [int(present[j]) for j in range(num_classes) if 0 < len(by_class[j]) < len(holders[j])]
    if thin:
        warnings.warn(
            f"classes: class(es) {thin[:10]} have fewer samples than clients sharing them; some clients "
            f"will hold fewer than classes_per_client={k} classes",
            stacklevel=2,
        )

    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for j, idx in enumerate(by_class):
        if not holders[j]:
            continue
        if mode == "random":
            idx = rng.permutation(idx)
        for client, piece in zip(holders[j], np.array_split(idx, len(holders[j]))):
            chunks[client].append(piece)
    return _finish([np.concatenate(c) if c else np.empty(0, np.int64) for c in chunks])


@register_partition("gamma")
def gamma(labels: Any, num_clients: int, *, gamma: float, seed: int) -> list[np.ndarray]:
    """γ-similarity (FBN App. C, from SCAFFOLD arXiv:1910.06378): a γ share is IID, the rest sorted.

    A random ``round(γ·N)`` samples form the homogeneous part and are split IID into
    ``num_clients`` near-equal shares; the remaining samples are stably sorted by label (their
    order within a class stays random) and cut sequentially into ``num_clients`` near-equal chunks.
    Client i gets IID share i plus chunk i (spec/002_fbn.md §6). ``gamma=1`` is IID; ``gamma=0``
    is sort-and-chunk (FedTAN's code), which gives one class per client when the classes are
    balanced and ``num_clients`` equals the number of classes. Client sizes differ by at most 2.

    Args:
        labels: 1-D array of non-negative integer labels.
        num_clients: number of clients n, ``1 <= n <= len(labels)``.
        gamma: similarity γ in [0, 1].
        seed: seed of the partitioner's ``np.random.default_rng``.

    Returns:
        One sorted ``int64`` index array per client; every index appears exactly once.

    Raises:
        PartitionError: on invalid arguments.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    if not _is_real(gamma) or not 0.0 <= gamma <= 1.0:  # NaN fails both comparisons
        raise PartitionError(f"gamma must be a real number in [0, 1] (γ-similarity), got {gamma!r}")
    rng = np.random.default_rng(_check_seed(seed))
    perm = rng.permutation(len(labels))
    n_homogeneous = int(np.floor(float(gamma) * len(labels) + 0.5))
    homogeneous, heterogeneous = perm[:n_homogeneous], perm[n_homogeneous:]
    heterogeneous = heterogeneous[np.argsort(labels[heterogeneous], kind="stable")]
    return _finish(
        [np.concatenate([a, b]) for a, b in zip(
            np.array_split(homogeneous, num_clients), np.array_split(heterogeneous, num_clients)
        )]
    )


@register_partition("quantity")
def quantity(labels: Any, num_clients: int, *, alpha: float, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Quantity skew: client sizes ∝ q ~ Dir(alpha·1_K), samples assigned IID.

    The "quantity-based skew" of NIID-Bench (Li et al. 2021, arXiv:2102.02079, §4.2): each
    client's label mix follows the global one, only the amounts differ. ``min_size`` is
    guaranteed by construction, with no redraws: each client first gets ``min_size`` samples and
    the remaining ``N − K·min_size`` are apportioned by q with largest-remainder rounding.
    [code≠here] NIID-Bench redraws q until every client has ``min_require_size`` samples.

    Args:
        labels: 1-D array of non-negative integer labels (only its length is used).
        num_clients: number of clients K, ``1 <= K <= len(labels)``.
        alpha: Dirichlet concentration, finite and > 0; smaller means more unequal sizes.
        seed: seed of the partitioner's ``np.random.default_rng``.
        min_size: least number of samples per client (default: 1).

    Returns:
        One sorted ``int64`` index array per client; every index appears exactly once.

    Raises:
        PartitionError: on invalid arguments, or when ``min_size * num_clients > len(labels)``.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    alpha = _check_alpha(alpha)
    min_size = _check_min_size(min_size, num_clients, len(labels))
    rng = np.random.default_rng(_check_seed(seed))
    q = _sample_dirichlet(rng, alpha, (1, num_clients))[0]
    sizes = min_size + _apportion(len(labels) - min_size * num_clients, q)
    perm = rng.permutation(len(labels))
    return _finish(np.split(perm, np.cumsum(sizes)[:-1]))


def _resolve_sources(sources: Any, present: np.ndarray, domain_names: Sequence[str] | None) -> list[int]:
    """Domain indices selected by ``sources`` (names or indices; default: every present domain)."""
    if sources is None:
        return [int(d) for d in present]
    if isinstance(sources, (str, numbers.Integral)):
        sources = [sources]
    out: list[int] = []
    names = [str(n).lower() for n in domain_names] if domain_names is not None else None
    for s in sources:
        if _is_int(s):
            d = int(s)
        elif isinstance(s, str) and names is not None and s.lower() in names:
            d = names.index(s.lower())
        else:
            valid = ", ".join(names) if names is not None else ", ".join(str(int(d)) for d in present)
            raise PartitionError(f"Unknown value {s!r} in sources. Valid values are {{{valid}}}")
        if d not in present:
            raise PartitionError(f"sources selects domain {s!r}, which has no samples")
        if d in out:
            raise PartitionError(f"sources lists domain {s!r} twice")
        out.append(d)
    return out


@register_partition("domains")
def domains(
    labels: Any,
    num_clients: int,
    *,
    seed: int,
    domains: Any,
    domain_names: Sequence[str] | None = None,
    sources: Any = None,
    clients_per_domain: int | None = None,
    per_client: int | None = None,
    fraction: float | None = None,
) -> list[np.ndarray]:
    """Feature-shift split (FedBN, spec/004_fedbn.md §2.1): whole data sources go to clients.

    Each selected source ("domain") is shuffled and cut into ``clients_per_domain`` clients of
    *equal* size, the same size for every source, as the paper equalises local datasets (743
    samples = 10 % of the smallest source). Clients are numbered source by source:
    client ``c`` holds source ``sources[c // clients_per_domain]``. Samples beyond the equal
    size are left out (the paper also uses only a fraction of each source).

    Args:
        labels: 1-D array of labels (only its length is checked).
        num_clients: ``len(sources) * clients_per_domain``.
        seed: seed of the partitioner's ``np.random.default_rng``.
        domains: source index of every sample (a multi-source dataset's ``domains``; passed by
            :func:`~fednorm.data.federated.build_federated_data`).
        domain_names: names of the sources, so ``sources`` may name them.
        sources: the sources to use, in client order, as names or indices (default: all, in
            index order). Leaving one out keeps it for a new, never-trained client
            (``fednorm adapt``).
        clients_per_domain: clients per source (default: ``num_clients / len(sources)``).
        per_client: training samples per client.
        fraction: instead of ``per_client``: ``floor(fraction · n_min)`` samples per client,
            ``n_min`` the smallest source's size (FedBN's "percent", 0.1 → 743 of 7,438).
            Default (neither given): the smallest source split equally among its clients.

    Returns:
        One sorted ``int64`` index array per client, each from a single source.

    Raises:
        PartitionError: on invalid arguments, or when a source is too small for the size asked.
    """
    labels = _check_labels(labels)
    dom = _check_labels(domains, "domains")
    if len(dom) != len(labels):
        raise PartitionError(f"domains has {len(dom)} entries but labels has {len(labels)}")
    rng = np.random.default_rng(_check_seed(seed))
    selected = _resolve_sources(sources, np.unique(dom), domain_names)
    num_domains = len(selected)
    if not _is_int(num_clients) or num_clients <= 0:
        raise PartitionError(f"num_clients must be a positive integer, got {num_clients!r}")
    if clients_per_domain is None:
        if num_clients % num_domains:
            raise PartitionError(
                f"num_clients={num_clients} is not a multiple of the {num_domains} sources; set "
                f"num_clients to {num_domains}·k or give clients_per_domain"
            )
        clients_per_domain = num_clients // num_domains
    cpd = _check_nonneg_int(clients_per_domain, "clients_per_domain")
    if cpd == 0 or cpd * num_domains != num_clients:
        raise PartitionError(
            f"clients_per_domain={clients_per_domain} with {num_domains} sources needs num_clients={cpd * num_domains}, "
            f"got {num_clients}"
        )
    members = [np.flatnonzero(dom == d) for d in selected]
    n_min = min(len(m) for m in members)
    smallest = selected[int(np.argmin([len(m) for m in members]))]
    small_name = f"'{domain_names[smallest]}'" if domain_names is not None else f"{smallest}"
    if per_client is not None and fraction is not None:
        raise PartitionError("give per_client or fraction, not both")
    if fraction is not None:
        if not _is_real(fraction) or not 0 < fraction <= 1:
            raise PartitionError(f"fraction must lie in (0, 1], got {fraction!r}")
        per_client = max(1, int(np.floor(fraction * n_min)))
    elif per_client is None:
        per_client = n_min // cpd
    per_client = _check_nonneg_int(per_client, "per_client")
    if per_client == 0 or per_client * cpd > n_min:
        raise PartitionError(
            f"per_client={per_client} with clients_per_domain={cpd} needs {per_client * cpd} samples per source, "
            f"but the smallest source has {n_min} (source {small_name}); lower per_client (at most {n_min // cpd})"
        )
    parts = []
    for m in members:
        m = rng.permutation(m)
        parts += [m[j * per_client : (j + 1) * per_client] for j in range(cpd)]
    return _finish(parts)


def client_domains(domains: Any, parts: Sequence[Any]) -> list[int] | None:
    """The source of each client when every client holds a single source, else ``None``.

    An empty client counts as mixed, since it has no source to be tested on.
    """
    dom = np.asarray(domains, dtype=np.int64)
    out = []
    for part in parts:
        d = np.unique(dom[np.asarray(part, dtype=np.int64)])
        if len(d) != 1:
            return None
        out.append(int(d[0]))
    return out


def split_by_domain(test_domains: Any, client_domain: Sequence[int], *, seed: int) -> list[np.ndarray]:
    """Per-client test splits for single-source clients: the clients of a source share that
    source's test set, shuffled and cut into near-equal parts (one client gets all of it). Test
    samples of sources no client holds are left out (e.g. a held-out source for ``adapt``)."""
    dom = _check_labels(test_domains, "test_domains")
    rng = np.random.default_rng(_check_seed(seed))
    owners: dict[int, list[int]] = {}
    for c, d in enumerate(client_domain):
        owners.setdefault(int(d), []).append(c)
    parts = [np.empty(0, np.int64) for _ in client_domain]
    for d, clients in sorted(owners.items()):
        idx = rng.permutation(np.flatnonzero(dom == d))
        for c, piece in zip(clients, np.array_split(idx, len(clients))):
            parts[c] = piece
    return _finish(parts)


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
    are left out. This is the per-client evaluation of the LN/FN paper ("each client's test split
    has the same label distribution as its train split", spec/003_ln_fn.md §2.1, §2.3) and of
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
