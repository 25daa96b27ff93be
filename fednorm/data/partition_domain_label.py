"""Label shift inside feature shift: each domain's samples split over its clients by label.

The LN/FN paper's PACS setting (Zhang et al., 2024, Sec. 5 and App. C.2, Table 5): the four
domains (photo, art painting, cartoon, sketch) are each split into 3 clients, by Dirichlet label
skew within the domain (Dir(0.5), Dir(1.0)) or into disjoint class sets ("two clients have two
classes each, and the other client has three"). Clients are numbered domain by domain, as in the
``domains`` partition; each client is tested on its own domain's test samples with its own label
mix (:func:`~fednorm.data.partition.split_like_by_domain`, used by
:func:`~fednorm.data.federated.build_federated_data`).

Kept apart from :mod:`~fednorm.data.partition_domain` and :mod:`~fednorm.data.partition_label`
because it composes the two.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import PartitionError
from .partition_base import _check_labels, _check_nonneg_int, _check_seed, _finish, _is_int, register_partition
from .partition_domain import _resolve_sources
from .partition_label import dirichlet

__all__ = ["domain_labels"]


@register_partition("domain_labels")
def domain_labels(
    labels: Any,
    num_clients: int,
    *,
    seed: int,
    domains: Any,
    domain_names: Sequence[str] | None = None,
    sources: Any = None,
    clients_per_domain: int | None = None,
    alpha: float | None = None,
    class_counts: Sequence[int] | None = None,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Each domain split over ``clients_per_domain`` clients by label (LN/FN paper, PACS, Table 5).

    With ``class_counts`` (e.g. ``[2, 2, 3]`` for PACS's 7 classes) the classes present in a
    domain are permuted (seeded, independently per domain) and cut, in that order, into disjoint
    sets of those sizes; client ``j`` of the domain gets every sample of its set's classes. The
    sizes must add up to the number of classes in the domain. Otherwise each class of the domain
    is spread over its clients by q ~ Dir(``alpha``) (the :func:`~fednorm.data.partition_label.dirichlet`
    partition applied to the domain's samples, with ``min_size``).

    Args:
        labels: 1-D array of labels.
        num_clients: ``len(sources) * clients_per_domain``.
        seed: seed of the partitioner's ``np.random.default_rng`` (each domain draws from a child seed).
        domains: source index of every sample (passed by ``build_federated_data``).
        domain_names: names of the sources, so ``sources`` may name them.
        sources: the domains to use, in client order (default: all, in index order).
        clients_per_domain: clients per domain (default: ``num_clients / len(sources)``).
        alpha: Dirichlet concentration within a domain (used when ``class_counts`` is not given).
        class_counts: class-set sizes of a domain's clients, one per client (then ``alpha`` is not used).
        min_size: fewest samples per client under the Dirichlet split.

    Returns:
        One sorted ``int64`` index array per client, each from a single domain; together every
        sample of the selected domains.

    Raises:
        PartitionError: on invalid arguments.
    """
    labels = _check_labels(labels)
    dom = _check_labels(domains, "domains")
    if len(dom) != len(labels):
        raise PartitionError(f"domains has {len(dom)} entries but labels has {len(labels)}")
    rng = np.random.default_rng(_check_seed(seed))
    selected = _resolve_sources(sources, np.unique(dom), domain_names)
    if not _is_int(num_clients) or num_clients <= 0:
        raise PartitionError(f"num_clients must be a positive integer, got {num_clients!r}")
    if clients_per_domain is None:
        if num_clients % len(selected):
            raise PartitionError(f"num_clients={num_clients} is not a multiple of the {len(selected)} domains; set "
                                 f"num_clients to {len(selected)}·k or give clients_per_domain")
        clients_per_domain = num_clients // len(selected)
    cpd = _check_nonneg_int(clients_per_domain, "clients_per_domain")
    if cpd == 0 or cpd * len(selected) != num_clients:
        raise PartitionError(f"clients_per_domain={clients_per_domain} with {len(selected)} domains needs "
                             f"num_clients={cpd * len(selected)}, got {num_clients}")
    if class_counts is not None:
        if isinstance(class_counts, (str, bytes)) or not all(_is_int(k) and int(k) > 0 for k in class_counts):
            raise PartitionError(f"class_counts must be a list of positive integers, got {class_counts!r}")
        counts = [int(k) for k in class_counts]
        if len(counts) != cpd:
            raise PartitionError(f"class_counts gives {len(counts)} class sets for {cpd} clients per domain")
    elif alpha is None:
        raise PartitionError("domain_labels needs alpha (Dirichlet within each domain) or class_counts (disjoint class sets)")
    parts: list[np.ndarray] = []
    for d in selected:
        members = np.flatnonzero(dom == d)
        child = int(rng.integers(0, 2**31 - 1))
        name = f"'{domain_names[d]}'" if domain_names is not None else f"{d}"
        if class_counts is not None:
            present = np.unique(labels[members])
            if sum(counts) != len(present):
                raise PartitionError(f"class_counts {counts} add up to {sum(counts)}, but domain {name} has {len(present)} classes")
            order = np.random.default_rng(child).permutation(present)
            cuts = np.cumsum([0, *counts])
            parts += [members[np.isin(labels[members], order[a:b])] for a, b in zip(cuts[:-1], cuts[1:])]
        else:
            try:
                local = dirichlet(labels[members], cpd, alpha=alpha, seed=child, min_size=min_size)
            except PartitionError as exc:
                raise PartitionError(f"domain {name}: {exc}") from None
            parts += [members[p] for p in local]
    return _finish(parts)
