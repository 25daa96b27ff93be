"""Re-export of :mod:`fednorm.rng`, kept so ``fednorm.engine.rng`` imports keep working.

The helpers live outside the engine so that methods (HBN's seeded statistics subset) can use
them without importing the engine that runs them, which imports the methods.
"""

from ..rng import derive_seed, numpy_rng, torch_generator

__all__ = ["derive_seed", "torch_generator", "numpy_rng"]
