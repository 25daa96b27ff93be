"""The scripts behind every figure in docs/: timings and accuracy runs, each writing a JSON record.

Run a script as ``python benchmarks/<name>.py ...`` (or ``python -m benchmarks.<name>`` from the
repository root). :mod:`benchmarks.harness` is their shared timing and result code;
:mod:`benchmarks.tables` renders docs/performance.md's tables from the committed results.

Each script puts the repository root first on ``sys.path`` before importing this package:
opacus installs a top-level package of the same name into site-packages.
"""
