"""The label partitions: IID, per-class and per-client (Hsu et al.) Dirichlet label skew, k classes
per client, FBN's γ-similarity and quantity skew (the non-IID generators of the papers fednorm reproduces).

Split out of :mod:`fednorm.data.partition` (one module per family); they are registered in
:data:`~fednorm.data.partition_base.PARTITIONS` and importable from :mod:`fednorm.data.partition`
as before.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np

from ..errors import PartitionError
from .partition_base import (
    _MIN_ALPHA,
    _apportion,
    _check_alpha,
    _check_labels,
    _check_min_size,
    _check_nonneg_int,
    _check_num_clients,
    _check_seed,
    _class_indices,
    _finish,
    _is_int,
    _is_real,
    _sample_dirichlet,
    register_partition,
)

__all__ = ["iid", "dirichlet", "dirichlet_client", "classes", "gamma", "quantity"]


@register_partition("iid")
def iid(labels: Any, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Random equal split: shuffle all indices and cut them into ``num_clients`` near-equal parts.

    The IID baseline of every paper (e.g. Wang et al., 2023, Sec. 6.1.1: shuffled, equal shares). Client sizes
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
    Hsu et al. 2019 (arXiv:1909.06335) as used, per class, by HBN (Chen et al., 2025,
    Sec. 4.1; its code's ``sampling.py``) and the LN/FN paper (Zhang et al., 2024, App. C.2; its
    code's ``label_shift``), and of
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

    FBN (Guerraoui et al., 2024, App. C.2) cites Hsu et al.'s method, which draws per *client*
    (q_i ~ Dir(alpha·p), equal client sizes); this function implements the per-class variant, and
    :func:`dirichlet_client` the per-client one.

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


def _client_class_proportions(
    rng: np.random.Generator, alpha: float, prior: np.ndarray, num_clients: int
) -> np.ndarray:
    """q_i ~ Dir(alpha·p) for each client i: a ``[num_clients, num_classes]`` array, rows summing to 1."""
    concentration = np.maximum(alpha * np.asarray(prior, dtype=float), _MIN_ALPHA)
    return _sample_dirichlet(rng, concentration, (num_clients, len(concentration)))


@register_partition("dirichlet_client")
def dirichlet_client(labels: Any, num_clients: int, *, alpha: float, seed: int) -> list[np.ndarray]:
    """Per-client Dirichlet label skew with equal client sizes (Hsu et al. 2019, arXiv:1909.06335).

    Each client i draws its class proportions q_i ~ Dir(alpha·p), where p is the prior class
    distribution (the class frequencies of ``labels``; uniform on CIFAR-10), and is given
    ``N / K`` samples (sizes differ by at most one, every sample is used). The samples are handed
    out one at a time, to the clients in a seeded random order (each client as often as its size):
    a client's sample is of class c with probability q_i,c, drawn without replacement from the
    class's shuffled samples. When a class runs out, the clients still filling redraw among the
    classes left, i.e. from q_i restricted to them and renormalised (Hsu et al.'s "redistribute";
    where q_i has no mass left on them, in proportion to the samples left). Until classes run
    out, a client's label mix is a multinomial sample of its q_i; as alpha grows it tends to p
    (IID), as alpha falls to one class per client. This is the split of FBN's Dirichlet
    experiments (Guerraoui et al., 2024, App. C.2 and C.3.2, citing Hsu et al.);
    :func:`dirichlet` is the per-class variant (unequal client sizes) that HBN and LN/FN use.

    The proportions are the first draw of ``np.random.default_rng(seed)``, so
    ``_client_class_proportions(np.random.default_rng(seed), alpha, p, K)`` recomputes them.
    [code≠here] FedLab's ``client_inner_dirichlet_partition`` (a Hsu-style implementation) draws
    q_i ~ Dir(alpha·1), i.e. this function's alpha times the number of classes for a uniform p, and
    picks a uniformly random unfilled client at each step instead of one in proportion to the
    room it has left.

    Args:
        labels: 1-D array of non-negative integer labels.
        num_clients: number of clients K, ``1 <= K <= len(labels)``.
        alpha: Dirichlet concentration, finite and > 0; smaller means more skew.
        seed: seed of the partitioner's ``np.random.default_rng``.

    Returns:
        One sorted ``int64`` index array per client; every index appears exactly once and client
        sizes differ by at most one.

    Raises:
        PartitionError: on invalid arguments.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, len(labels))
    alpha = _check_alpha(alpha)
    rng = np.random.default_rng(_check_seed(seed))
    _, by_class = _class_indices(labels)
    left = np.array([len(idx) for idx in by_class], dtype=np.int64)
    q = _client_class_proportions(rng, alpha, left / left.sum(), num_clients)
    sizes = np.array([len(a) for a in np.array_split(np.arange(len(labels)), num_clients)])
    pools = [rng.permutation(idx) for idx in by_class]
    turns = rng.permutation(np.repeat(np.arange(num_clients), sizes))  # whose sample comes next
    draws = rng.random(len(turns))

    owner = np.empty(len(labels), dtype=np.int64)
    cum = np.cumsum(q, axis=1)  # per client, the CDF of its q over the classes not yet exhausted
    for client, u in zip(turns.tolist(), draws.tolist()):
        row = cum[client]
        if row[-1] > 0:
            weights = row
        else:  # q_i's mass is all on exhausted classes: draw in proportion to what is left
            weights = np.cumsum(left)
        c = int(np.searchsorted(weights, u * weights[-1], side="right"))
        if c == len(weights):  # u * total rounded up to the total: the last class with mass
            c = int(np.flatnonzero(np.diff(weights, prepend=0.0) > 0)[-1])
        left[c] -= 1
        owner[pools[c][left[c]]] = client
        if left[c] == 0:
            q[:, c] = 0.0
            cum = np.cumsum(q, axis=1)
    order = np.argsort(owner, kind="stable")
    return _finish(np.split(order, np.cumsum(sizes)[:-1]))


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
      ... (Wang et al., 2023, Sec. 6.1.1; its released code sorts and chunks); k = 1 with C clients gives one
      whole class per client (LN/FN's and FBN's extreme case).
    - ``"ring"``: ``perm`` is the identity, ``start_c = floor(c·C/K)``, dataset order. This is
      FedTAN's Suppl. D ring (Fig. 5): with K = 5 clients on 10 classes, client c holds
      {2c, ..., 2c + k − 1} mod 10, so each class is held by k/2 clients. It equals
      ``"sequential"`` when k = C/K.

    Relation to LN/FN's ``class_part`` (the authors' released code) [code≠here]: ``class_part`` cuts
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
    Client i gets IID share i plus chunk i (Guerraoui et al., 2024, App. C.1). ``gamma=1`` is IID; ``gamma=0``
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
