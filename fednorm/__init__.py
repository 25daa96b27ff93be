"""fednorm: federated learning with normalization layers on non-IID data."""

__version__ = "0.1.0"
