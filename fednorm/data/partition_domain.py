"""The feature-shift partition: whole data sources ("domains") go to clients (FedBN), and the
per-source test splits of such clients.

Split out of :mod:`fednorm.data.partition` (one module per family); importable from there as before.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from ..errors import PartitionError
from .partition_base import _check_labels, _check_nonneg_int, _check_seed, _finish, _is_int, _is_real, register_partition

__all__ = ["domains", "client_domains", "split_by_domain"]


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
    pooled: bool = False,
    equal: bool = True,
) -> list[np.ndarray]:
    """Feature-shift split (FedBN, Li et al., 2021, Sec. 5.1): whole data sources go to clients.

    Each selected source ("domain") is shuffled and cut into ``clients_per_domain`` clients of
    *equal* size, the same size for every source, as the paper equalises local datasets (743
    samples = 10 % of the smallest source). Clients are numbered source by source:
    client ``c`` holds source ``sources[c // clients_per_domain]``. Samples beyond the equal
    size are left out (the paper also uses only a fraction of each source).

    ``equal=False`` keeps each source's own size instead: its samples (or ``fraction`` of them)
    are cut into ``clients_per_domain`` near-equal clients, so clients of different sources differ
    in size, as FedBN's ABIDE sites do (Li et al., 2021, Table 1 and App. D.4: each site's client
    holds all of its data) and its unequal-size study (App. E.6, ``fraction`` 0.1 of each source).

    ``pooled=True`` gives one client all of those samples instead (``num_clients`` 1, one
    client's share per source): FedBN's centralized training, which "pools all training data in
    to a center" (Li et al., 2021, App. E.3, Table 12). With the same seed and options it pools
    exactly the samples the one-client-per-source split hands out.

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
        pooled: one client holding every selected source's share (default: False).
        equal: every client the same size (default: True); False keeps each source's own size.

    Returns:
        One sorted ``int64`` index array per client, each from a single source (with ``pooled``, one
        array holding every selected source's share).

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
    if not isinstance(pooled, (bool, np.bool_)):
        raise PartitionError(f"pooled must be true or false, got {pooled!r}")
    if pooled:
        if num_clients != 1 or clients_per_domain not in (None, 1):
            raise PartitionError(
                f"pooled: true gives one client every source's share: set num_clients to 1 (got {num_clients}) and "
                "leave clients_per_domain out"
            )
        clients_per_domain, num_clients = 1, num_domains  # sized as one client per source, then pooled
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
    if fraction is not None and (not _is_real(fraction) or not 0 < fraction <= 1):
        raise PartitionError(f"fraction must lie in (0, 1], got {fraction!r}")
    if not isinstance(equal, (bool, np.bool_)):
        raise PartitionError(f"equal must be true or false, got {equal!r}")
    if not equal:
        if per_client is not None:
            raise PartitionError("per_client gives every client one size; with equal: false each source keeps its own "
                                 "size (scale it with fraction), so leave per_client out")
        parts = []
        for d, m in zip(selected, members):
            n = len(m) if fraction is None else max(1, int(np.floor(fraction * len(m))))
            if n < cpd:
                name = f"'{domain_names[d]}'" if domain_names is not None else f"{d}"
                raise PartitionError(f"source {name} has {n} samples to share, fewer than clients_per_domain={cpd}")
            parts += np.array_split(rng.permutation(m)[:n], cpd)
        return _finish([np.concatenate(parts)] if pooled else parts)
    if fraction is not None:
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
    return _finish([np.concatenate(parts)] if pooled else parts)


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
