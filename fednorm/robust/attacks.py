"""Byzantine attacks on client uploads: statistics and/or model updates (Guerraoui et al., 2024, Sec. 5).

An omniscient adversary controls f clients: all f send the same vector, computed from the honest
clients' vectors (the convention of the literature and of ByzFL):

* ``sign_flip`` (SF; Allen-Zhu et al. 2020, arXiv:2012.14368): ``−mean(honest)``. On statistics
  this is the FBN paper's "send the opposite of the mean".
* ``foe`` (Fall of Empires; Xie et al. 2020, arXiv:1903.03936): ``(1 − τ)·mean(honest)``, ByzFL's
  default ``τ = 3`` (i.e. −2× the mean).
* ``alie`` (A Little Is Enough; Baruch et al. 2019, arXiv:1902.06156):
  ``mean(honest) + τ·std(honest)`` coordinate-wise, ``std`` with ddof = 1; ByzFL's default
  ``τ = 1.5``. ``tau: null`` uses the paper's ``z_max = Φ⁻¹((n − s)/n)``, ``s = ⌊n/2 + 1⌋ − f``
  (0.52 for n = 10, f = 3).

Where they act (:class:`ByzantineAttack`): the simulator appends f Byzantine rows to a round's
honest updates, just before the method aggregates (the Byzantine clients hold no data: the data
is split over the honest ``num_clients``, as in ByzFL). Targets:

* ``stats``: the statistics a method declares (:meth:`Method.statistics_keys`): BN running means
  under FedAvg (naive BN), FBN's uploaded local copies under FBN. Means by default; variances
  too with ``attack_args: {variance: true}``, clamped at 0 (FOE would make them negative).
* ``updates``: every other floating shared tensor, attacked as an update ``θ_i − θ`` (for DSGD
  this is the client's momentum times −lr), so SF sends ``−mean`` of the honest updates.
* ``both``.

A tensor that is not attacked receives the honest mean (a Byzantine client that looks honest
there); counts and ``num_examples`` receive the honest mean, integer tensors the honest maximum.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Callable, Literal

import torch

from ..errors import ConfigError
from ..registry import Registry

__all__ = ["ATTACKS", "register_attack", "sign_flip", "foe", "alie", "alie_zmax", "ByzantineAttack", "get_attack"]

AttackFn = Callable[..., torch.Tensor]
ATTACKS: Registry[AttackFn] = Registry("attack")
register_attack = ATTACKS.register


@register_attack("sign_flip")
def sign_flip(honest: torch.Tensor, *, num_byzantine: int = 1) -> torch.Tensor:
    """SF: ``−mean(honest)`` over the leading (client) axis."""
    return -honest.double().mean(0)


@register_attack("foe")
def foe(honest: torch.Tensor, *, tau: float = 3.0, num_byzantine: int = 1) -> torch.Tensor:
    """Fall of Empires: ``(1 − τ)·mean(honest)`` (default τ = 3, ByzFL's)."""
    return (1.0 - tau) * honest.double().mean(0)


def alie_zmax(num_clients: int, num_byzantine: int) -> float:
    """Baruch et al.'s ``z_max = Φ⁻¹((n − s)/n)`` with ``s = ⌊n/2 + 1⌋ − f`` (n counts all clients)."""
    s = math.floor(num_clients / 2 + 1) - num_byzantine
    return NormalDist().inv_cdf((num_clients - s) / num_clients)


@register_attack("alie")
def alie(honest: torch.Tensor, *, tau: float | None = 1.5, num_byzantine: int = 1) -> torch.Tensor:
    """A Little Is Enough: ``mean + τ·std`` coordinate-wise (ddof = 1; default τ = 1.5, ByzFL's).

    ``tau=None`` uses :func:`alie_zmax` with n = honest + Byzantine clients.
    """
    h = honest.double()
    if tau is None:
        tau = alie_zmax(h.shape[0] + num_byzantine, num_byzantine)
    std = h.std(0, correction=1) if h.shape[0] > 1 else torch.zeros_like(h[0])
    return h.mean(0) + tau * std


Target = Literal["stats", "updates", "both"]


class ByzantineAttack:
    """Appends ``num_byzantine`` attacking rows to a round's :class:`ClientUpdates`.

    Args:
        name: a name in :data:`ATTACKS` (``sign_flip``, ``foe``, ``alie``).
        num_byzantine: f, the number of Byzantine clients (each sends the same vector).
        targets: ``stats``, ``updates`` or ``both`` (default: ``stats``, what the FBN paper
            attacks, Guerraoui et al., 2024, Sec. 5).
        args: options of the attack (``tau``) plus ``variance`` (also attack variances; default
            False).
        first_id: client id of the first Byzantine client (ids ``first_id .. first_id + f − 1``).
    """

    def __init__(
        self, name: str, num_byzantine: int, targets: Target = "stats", args: dict[str, Any] | None = None, *, first_id: int = 0
    ) -> None:
        try:
            self.fn = ATTACKS.get_builder(name)
        except ValueError as exc:
            raise ConfigError(f"attack: {exc}") from None
        if targets not in ("stats", "updates", "both"):
            raise ConfigError(f"Unknown value '{targets}' for argument attack_targets. Valid values are {{stats, updates, both}}")
        if not isinstance(num_byzantine, int) or num_byzantine < 1:
            raise ConfigError(f"num_byzantine must be >= 1 when an attack is set, got {num_byzantine!r}")
        args = dict(args or {})
        self.variance = bool(args.pop("variance", False))
        try:
            self.fn(torch.zeros(2, 1), num_byzantine=num_byzantine, **args)
        except TypeError as exc:
            raise ConfigError(f"attack_args for '{name}': {exc}") from None
        self.name = name
        self.num_byzantine = num_byzantine
        self.targets = targets
        self.args = args
        self.first_id = first_id

    def vector(self, honest: torch.Tensor) -> torch.Tensor:
        """The Byzantine vector computed from the honest rows ``[h, *shape]`` (float64)."""
        return self.fn(honest, num_byzantine=self.num_byzantine, **self.args)

    def __call__(self, updates: Any, global_state: dict[str, torch.Tensor], method: Any) -> Any:
        """Return ``updates`` with f Byzantine rows appended (honest rows unchanged)."""
        from ..methods.base import ClientUpdates

        f = self.num_byzantine
        if len(updates) == 0:
            return updates
        stats = method.statistics_keys()
        mean_keys, var_keys = set(stats.get("mean", ())), set(stats.get("var", ()))
        attack_stats = self.targets in ("stats", "both")
        attack_updates = self.targets in ("updates", "both")

        def byzantine_rows(key: str, honest: torch.Tensor, *, in_state: bool) -> torch.Tensor:
            if not honest.is_floating_point():
                value = honest.max(0).values
            elif key in mean_keys and attack_stats:
                value = self.vector(honest)
            elif key in var_keys and attack_stats and self.variance:
                value = self.vector(honest).clamp_min(0.0)
            elif in_state and attack_updates and key not in mean_keys and key not in var_keys:
                ref = global_state[key].double()
                value = ref + self.vector(honest.double() - ref)
            else:
                value = honest.double().mean(0)
            return value.to(honest.dtype).unsqueeze(0).expand(f, *value.shape).clone()

        states = {k: torch.cat([v, byzantine_rows(k, v, in_state=True)]) for k, v in updates.states.items()}
        extras = {k: torch.cat([v, byzantine_rows(k, v, in_state=False)]) for k, v in updates.extras.items()}
        def rep(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, value.to(t.dtype).reshape(1).expand(f)])

        return ClientUpdates(
            client_ids=list(updates.client_ids) + [self.first_id + j for j in range(f)],
            states=states,
            num_examples=rep(updates.num_examples, updates.num_examples.double().mean()),
            train_loss=rep(updates.train_loss, torch.tensor(float("nan"))),
            num_steps=rep(updates.num_steps, updates.num_steps.max()),
            extras=extras,
            failures=dict(updates.failures),
            seconds=None if updates.seconds is None else rep(updates.seconds, torch.tensor(0.0)),
        )

    def __repr__(self) -> str:
        return f"ByzantineAttack({self.name}, f={self.num_byzantine}, targets={self.targets}, args={self.args}, variance={self.variance})"


def get_attack(name: str | None, num_byzantine: int, targets: Target = "stats", args: dict[str, Any] | None = None, *, first_id: int = 0) -> ByzantineAttack | None:
    """Build an attack, or None for ``name`` in (None, "none")."""
    if name is None or name.strip().lower() == "none":
        return None
    return ByzantineAttack(name, num_byzantine, targets, args, first_id=first_id)
