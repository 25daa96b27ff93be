"""fednorm's version, in a module of its own so that the engine can record it without importing
the package (whose ``__init__`` imports the engine)."""

__version__ = "0.1.0"
