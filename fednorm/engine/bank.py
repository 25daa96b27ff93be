"""Per-client persistent state, indexed by client id.

FedBN's BatchNorm tensors, HBN's alpha, SCAFFOLD's control variates and DSGD's client
momentum all live here. A client that was never sampled has no entry and costs nothing;
the method supplies its initial state on first use.
"""

from __future__ import annotations

from typing import Iterator

import torch

__all__ = ["ClientStateBank"]


class ClientStateBank:
    """A dict ``client_id -> {name: tensor}`` kept on ``device`` (CPU by default)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._states: dict[int, dict[str, torch.Tensor]] = {}

    def get(self, client_id: int) -> dict[str, torch.Tensor] | None:
        return self._states.get(int(client_id))

    def put(self, client_id: int, state: dict[str, torch.Tensor]) -> None:
        """Store detached copies, so later in-place training cannot alter the bank."""
        self._states[int(client_id)] = {k: v.detach().to(self.device, copy=True) for k, v in state.items()}

    def restore(self, client_id: int, state: dict[str, torch.Tensor] | None) -> None:
        """Set ``client_id``'s entry back to ``state`` as :meth:`get` returned it (None: no entry),
        e.g. after a round that failed part-way through."""
        if state is None:
            self._states.pop(int(client_id), None)
        else:
            self._states[int(client_id)] = state

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._states))

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self._states.values() for t in s.values())

    def state_dict(self) -> dict[int, dict[str, torch.Tensor]]:
        return {cid: dict(s) for cid, s in self._states.items()}

    def load_state_dict(self, state: dict[int, dict[str, torch.Tensor]]) -> None:
        """Copies, as :meth:`put`: entries of a loaded checkpoint may share one tensor (a compacted
        DSGD checkpoint, ``fednorm.engine.compact``), which must not stay shared between clients."""
        self._states = {int(cid): {k: v.to(self.device, copy=True) for k, v in s.items()} for cid, s in state.items()}
