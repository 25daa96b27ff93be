"""Client-level differential privacy (issue 22): ``dp_noise`` σ, ``dp_clip`` C, ``dp_stats_bound`` B,
``dp_delta`` δ. :class:`ClientLevelDP` clips, bounds and noises every upload; ε at δ comes from
Opacus's RDP accountant (:func:`epsilon`). docs/privacy.md describes the formulation."""

from .accounting import epsilon, require_opacus
from .mechanism import PUBLIC_COUNT, ClientLevelDP, clip_update

__all__ = ["ClientLevelDP", "PUBLIC_COUNT", "clip_update", "epsilon", "require_opacus"]
