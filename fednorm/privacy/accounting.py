"""The privacy spent: ε at δ of the client that took part in the most rounds, from Opacus's
RDP accountant (the optional extra ``fednorm[dp]``).

Each round a client takes part in, its upload is one Gaussian mechanism with the mechanism's
noise multiplier (:attr:`fednorm.privacy.ClientLevelDP.noise_multiplier`); the rounds compose.
Sample rate 1: the server sees which clients uploaded, so no amplification by subsampling.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

__all__ = ["epsilon", "require_opacus"]


def require_opacus() -> None:
    try:
        import opacus.accountants  # noqa: F401
    except ImportError:
        raise ConfigError(
            "dp_noise needs Opacus for the privacy accounting: pip install 'fednorm[dp]' (or pip install opacus)"
        ) from None


def epsilon(mechanisms: list[tuple[float, int]], delta: float) -> float:
    """ε at ``delta`` of the composition of Gaussian mechanisms ``[(noise multiplier, times), ...]``
    (Opacus's RDP accountant, sample rate 1); inf when one that ran has no noise, 0 when none ran."""
    ran = [(z, n) for z, n in mechanisms if n > 0]
    if not ran:
        return 0.0
    if any(z <= 0 for z, _ in ran):
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for z, n in ran:
        for _ in range(n):
            accountant.step(noise_multiplier=z, sample_rate=1.0)
    return float(accountant.get_epsilon(delta))
