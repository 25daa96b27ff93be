"""The run directory: a contract that benchmarks and users rely on.

``config.yaml`` (fully resolved; ``fednorm run --config RUN/config.yaml`` repeats the run, into a
new directory ``RUN-2``: the CLI never writes over an earlier run without ``--overwrite``),
``metrics.jsonl`` (one JSON object per evaluation, flushed as it is written),
``summary.json`` and ``accuracy.png``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..errors import RunWriteError
from .run_dir_watch import check_not_removed, unwatch, watch

__all__ = ["RunWriter", "read_metrics", "read_summary", "default_run_dir", "json_safe"]


def json_safe(value: Any) -> Any:
    """JSON cannot hold NaN/Inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def default_run_dir(config: ExperimentConfig, root: str | Path = "runs") -> Path:
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    # names like user:tensors (your own data) or a model's user:cnn: no ':' in a folder name
    # (Windows refuses it, and shells and scp read it as host:path)
    parts = [re.sub(r"[^A-Za-z0-9_.-]+", "-", str(p)) for p in (config.method, config.norm, config.dataset)]
    base = Path(root) / f"{'-'.join(parts)}-{stamp}"
    path, i = base, 1
    while path.exists():
        path = Path(f"{base}-{i}")
        i += 1
    return path


class RunWriter:
    """Writes one run's directory as the run progresses."""

    def __init__(self, out_dir: str | Path, config: ExperimentConfig, history: list[dict[str, Any]] | None = None) -> None:
        """Start (or, with ``history``, continue) a run directory.

        When resuming, ``metrics.jsonl`` is rewritten from the checkpoint's ``history`` first,
        so evaluations logged after that checkpoint (and recomputed now) are not duplicated.
        """
        self.dir = Path(out_dir)
        self.config = config
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            watch(self.dir)  # every later write checks the directory is still this one (rm -rf mid-run: issue 50)
        except OSError as exc:
            raise RunWriteError(self.dir, exc) from exc
        try:
            self._atomic_write("config.yaml", config.to_yaml())
            try:
                if history is not None:
                    self._atomic_write("metrics.jsonl", "".join(json.dumps(json_safe(r)) + "\n" for r in history))
                    self._metrics = open(self.dir / "metrics.jsonl", "a")
                else:
                    self._metrics = open(self.dir / "metrics.jsonl", "w")
            except OSError as exc:
                raise RunWriteError(self.dir / "metrics.jsonl", exc) from exc
        except RunWriteError:
            unwatch(self.dir)  # this writer never opened: nothing to watch
            raise

    def _atomic_write(self, name: str, text: str) -> None:
        """Write ``name`` whole or not at all; a failure (full disk, size limit) names the file."""
        tmp = self.dir / f".{name}.tmp"
        try:
            check_not_removed(self.dir)
            tmp.write_text(text)
            os.replace(tmp, self.dir / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RunWriteError(self.dir / name, exc) from exc

    def log(self, record: dict[str, Any]) -> None:
        try:
            check_not_removed(self.dir)  # else the line goes into the deleted file
            self._metrics.write(json.dumps(json_safe(record)) + "\n")
            self._metrics.flush()
        except OSError as exc:
            raise RunWriteError(self.dir / "metrics.jsonl", exc) from exc

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        try:
            self.close()
        except OSError:  # a metrics line that could not be flushed: the summary says why the run failed
            pass
        try:
            self._atomic_write("summary.json", json.dumps(json_safe(summary), indent=2) + "\n")
        finally:
            unwatch(self.dir)
        # A curve needs two points: a one-evaluation run (a smoke test, `--rounds 1`) skips
        # matplotlib, which costs more than such a run's training (about 1.5 s of import and
        # drawing); its one point is in metrics.jsonl and summary.json.
        if len(history) >= 2:
            from ..plotting import plot_accuracy

            cfg = self.config
            try:  # the results are written: a plot that cannot be is a warning, not a failed run
                plot_accuracy(history, self.dir / "accuracy.png", title=f"{cfg.method} + {cfg.norm} on {cfg.dataset} ({cfg.partition})")
                if any("diag/seconds" in h for h in history):  # --diagnostics (fednorm.diagnostics)
                    from ..diagnostics import plot_diagnostics

                    plot_diagnostics({cfg.method: history}, self.dir / "diagnostics.png", title=f"{cfg.method} + {cfg.norm}")
            except OSError as exc:
                import warnings

                warnings.warn(f"could not write the plots of {self.dir}: {exc.strerror or exc}", stacklevel=2)

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json``; one written by an older fednorm has its last-10 figure recomputed from
    ``metrics.jsonl`` (:func:`fednorm.engine.last_rounds.upgrade_summary`)."""
    from .last_rounds import upgrade_summary

    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    if isinstance(summary, dict) and "last10_rounds" not in summary and "last10_mean_test_accuracy" in summary:
        try:
            history: list[dict[str, Any]] | None = read_metrics(run_dir)
        except (OSError, ValueError):
            history = None
        upgrade_summary(summary, history)
    return summary
