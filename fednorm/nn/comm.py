"""Cross-client reduction handles, the federated analogue of a process group.

A norm layer that needs statistics of *all* participating clients (FedTAN's layer-wise
aggregation) calls ``comm.reduce(t)`` on a tensor whose leading axis indexes the clients it
holds. In the in-process simulator all clients live in one tensor and the reduction is a plain
sum; a distributed runtime sums its local clients and then all-reduces across processes, so the
layer's code is the same in both.

Every reduction is one *exchange* of the client-server protocol that FedTAN's paper counts
(Wang et al., 2023, Sec. 5.3, 6.5.2): each participating client uploads its tensor, the server sums and
broadcasts the result. The handle counts exchanges and bytes where they happen
(:class:`CommTraffic`), so reported communication is a count, not a formula; the backward
pass's exchanges (the gradients of the statistics) are counted the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["ClientComm", "CommTraffic", "LocalClientComm"]


@dataclass
class CommTraffic:
    """What a handle's exchanges moved, counted in the client-server protocol.

    An all-reduce over processes moves other bytes on the wire; these counts are the
    federated protocol's (what the paper's Tables 3-5 count), so the simulator and the
    distributed runtime report the same figures.

    Attributes:
        exchanges: communication rounds, each one upload from every participating client
            and one broadcast back.
        uplink_bytes: bytes uploaded, summed over the clients.
        downlink_bytes: bytes received, summed over the clients (a broadcast counts once per
            receiving client).
        broadcast_bytes: bytes the server broadcast, each broadcast counted once (the paper's
            convention).
    """

    exchanges: int = 0
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    broadcast_bytes: int = 0

    def record(self, payload_bytes: int, num_clients: int) -> None:
        """One exchange: ``num_clients`` clients each upload ``payload_bytes`` and receive the
        sum, which has the same size."""
        self.exchanges += 1
        self.uplink_bytes += num_clients * payload_bytes
        self.downlink_bytes += num_clients * payload_bytes
        self.broadcast_bytes += payload_bytes

    def __add__(self, other: "CommTraffic") -> "CommTraffic":
        return CommTraffic(
            self.exchanges + other.exchanges,
            self.uplink_bytes + other.uplink_bytes,
            self.downlink_bytes + other.downlink_bytes,
            self.broadcast_bytes + other.broadcast_bytes,
        )

    @staticmethod
    def across_ranks(parts: Sequence["CommTraffic"]) -> "CommTraffic":
        """One round's traffic from the counts of the processes that host its clients.

        Every exchange is a collective, so each process that took part counted it once, with
        its own clients' uploads and downloads: those add up, while the exchanges and the
        broadcasts are the same on every participating process (the maximum also covers a
        process that hosted no client this round).
        """
        if not parts:
            return CommTraffic()
        return CommTraffic(
            exchanges=max(p.exchanges for p in parts),
            uplink_bytes=sum(p.uplink_bytes for p in parts),
            downlink_bytes=sum(p.downlink_bytes for p in parts),
            broadcast_bytes=max(p.broadcast_bytes for p in parts),
        )


class ClientComm:
    """Interface: sums over every participating client, each one counted exchange.

    Subclasses implement ``_sum_participants``; everything else, the counting included,
    is shared, so every runtime counts alike.
    """

    def __init__(self) -> None:
        self.traffic = CommTraffic()

    def _sum_participants(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` (this handle's clients, already summed) summed over all participants."""
        raise NotImplementedError

    def exchange(self, local_sum: torch.Tensor, num_clients: int) -> torch.Tensor:
        """One exchange: ``num_clients`` clients here whose uploads sum to ``local_sum``; returns
        the sum over all participants. Not differentiable."""
        local_sum = local_sum.detach()
        self.traffic.record(local_sum.numel() * local_sum.element_size(), num_clients)
        return self._sum_participants(local_sum)

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over its leading client axis and over all other participants (one
        exchange; a 0-d ``t`` is one client's). Not differentiable: see :meth:`shared` and
        :meth:`sum` for the backward pass."""
        if t.dim() == 0:
            return self.exchange(t, 1)
        return self.exchange(t.detach().sum(dim=0), t.shape[0])

    def shared(self, local: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``value`` for each of this handle's clients (``[K, *value.shape]``), differentiable as
        the sum of ``local`` (``[K, ...]``) over all clients, which ``value`` must equal (e.g. a
        :meth:`reduce` of it).

        The forward pass costs nothing (the value was exchanged already); the backward pass is
        one exchange: the clients' gradients are summed and every client receives the total.
        FedTAN needs two forward exchanges per layer (the mean, then the variance around it)
        but only one backward exchange for both statistics' gradients (Algorithm 3): pass the
        layer's statistics here together.
        """
        return _Shared.apply(local, value, self)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Differentiable :meth:`reduce`: its backward pass is another exchange (the gradients),
        counted too."""
        return _Sum.apply(t, self)

    @property
    def bytes_sent(self) -> int:
        """Bytes this handle has put on the wire (0 when nothing crosses a process boundary)."""
        return 0


class _Shared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, value: torch.Tensor, comm: ClientComm) -> torch.Tensor:  # type: ignore[override]
        ctx.comm = comm
        value = value.detach()
        return (value if value.dim() == local.dim() else value.unsqueeze(0)).expand(local.shape).clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        total = ctx.comm.reduce(grad)
        return (total if total.dim() == grad.dim() else total.unsqueeze(0)).expand(grad.shape), None, None


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, comm: ClientComm) -> torch.Tensor:  # type: ignore[override]
        ctx.comm, ctx.shape = comm, t.shape
        return comm.reduce(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        # Each client's share of the loss sits on this process's graph already summed; other
        # processes hold theirs, so the gradient is summed over participants (one exchange).
        num_clients = ctx.shape[0] if len(ctx.shape) else 1
        total = ctx.comm.exchange(grad, num_clients)
        return total.expand(ctx.shape) if len(ctx.shape) else total, None


class LocalClientComm(ClientComm):
    """All clients are rows of one tensor in this process; the sum needs nothing more."""

    def _sum_participants(self, local: torch.Tensor) -> torch.Tensor:
        return local

    def row_totals(self, rows: torch.Tensor, sizes: Sequence[int] | None = None) -> float | torch.Tensor:
        """The samples every participant of a row's exchanges holds (``rows``: each row's own, in
        the activations' dtype; ``sizes``: the same counts on the host, when the caller knows them):
        here all rows take part in one exchange. Known without an exchange, and from ``sizes``
        without a read of the device: whole numbers up to 2^24 add exactly in float32 and float64,
        so ``float(sum(sizes))`` is the float ``rows.sum()`` gives."""
        if sizes is not None and rows.dtype in (torch.float32, torch.float64) and sum(sizes) <= 1 << 24:
            return float(sum(sizes))
        return float(rows.sum())


class GroupedClientComm(LocalClientComm):
    """The rows of one tensor in groups that never exchange with each other: several runs
    stacked in one model, each run's clients synchronised among themselves only
    (:mod:`fednorm.engine.stacked_runs`). :meth:`reduce` returns each row its group's sum
    (``[K, ...]`` instead of ``[...]``), and each group's exchanges are counted as that run
    alone counts them (:attr:`traffic_by_group`).

    ``groups``: each current row's group id (``[K]``, or a list of ints), set before each
    synchronised step. The sizes and counts an exchange needs are kept on the host, so that no
    exchange reads the device.
    """

    def __init__(self) -> None:
        super().__init__()
        self._groups: torch.Tensor | None = None
        self._ids: list[int] = []
        self._on_device: dict[torch.device, torch.Tensor] = {}
        self.traffic_by_group: dict[int, CommTraffic] = {}

    @property
    def groups(self) -> torch.Tensor | None:
        return self._groups

    @groups.setter
    def groups(self, value: torch.Tensor | Sequence[int] | None) -> None:
        self._ids = [] if value is None else (value.tolist() if isinstance(value, torch.Tensor) else [int(v) for v in value])
        self._groups = None if value is None else torch.tensor(self._ids, dtype=torch.long)
        self._on_device = {}

    def _groups_on(self, device: torch.device) -> torch.Tensor:
        """The groups on ``device``, copied once per step (pinned and asynchronous on CUDA)."""
        assert self._groups is not None, "set the rows' groups before a synchronised step"
        if device not in self._on_device:
            g = self._groups
            self._on_device[device] = (g.pin_memory().to(device, non_blocking=True) if device.type == "cuda"
                                       else g.to(device))
        return self._on_device[device]

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        groups = self._groups_on(t.device)
        sums = t.detach().new_zeros((max(self._ids) + 1, *t.shape[1:])).index_add_(0, groups, t.detach())
        payload = sums[0].numel() * sums.element_size()
        for g in sorted(set(self._ids)):
            n = self._ids.count(g)
            self.traffic_by_group.setdefault(g, CommTraffic()).record(payload, n)
            self.traffic.record(payload, n)
        return sums.index_select(0, groups)

    def row_totals(self, rows: torch.Tensor, sizes: Sequence[int] | None = None) -> float | torch.Tensor:
        groups = self._groups_on(rows.device)
        sums = rows.new_zeros(max(self._ids) + 1).index_add_(0, groups, rows)
        return sums.index_select(0, groups)
