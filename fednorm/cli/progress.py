"""Progress of ``fednorm run`` and ``fednorm compare`` where no progress bar can show.

When stdout is not a terminal (a log file, a pipe, a batch scheduler) the tqdm bar is off, and a
long run would print nothing for minutes. :class:`ProgressLines` prints one line per evaluation
instead: the round, the test accuracy (with ε at δ on a differentially private run), the time so
far and an estimate of the time left::

    [3/8] fedln+ln round 10/15: test accuracy 71.32%, elapsed 12s, ETA 6s
    fedavg+bn round 3/15: test accuracy 41.20%, epsilon 187 at delta 1e-05, elapsed 4s, ETA 16s
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ..tracking.callback import Callback

__all__ = ["ProgressLines", "format_seconds", "wants_lines"]


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def wants_lines(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stdout) is not a terminal, so lines beat a bar."""
    stream = stream or sys.stdout
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


class ProgressLines(Callback):
    """A round-loop callback (:class:`fednorm.tracking.Callback`) for :func:`fednorm.api.run` / :func:`fednorm.api.compare`.

    Args:
        stream: where to print (default: stdout at call time).
        variants: the number of runs that will report (``compare``), for an ``[i/n]`` prefix.
    """

    def __init__(self, stream: TextIO | None = None, variants: int | None = None) -> None:
        self.stream = stream
        self.variants = variants
        # each run's index, clock start and first round; runs may report in turn (stacked runs)
        self._runs: dict[int, tuple[int, float, int]] = {}

    @property
    def _index(self) -> int:
        """How many runs have reported so far."""
        return len(self._runs)

    def on_round_end(self, record: Any, sim: Any) -> None:
        now = time.perf_counter()
        if id(sim) not in self._runs:  # a new run: its clock starts at the beginning of this first round
            self._runs[id(sim)] = (len(self._runs) + 1, now - float(getattr(record, "seconds", 0.0) or 0.0),
                                   record.server_round - 1)
        index, t0, r0 = self._runs[id(sim)]
        if not record.metrics:
            return
        cfg = sim.config
        elapsed = now - t0
        done = record.server_round - r0
        left = cfg.rounds - record.server_round
        eta = elapsed / done * left if done > 0 else 0.0
        prefix = f"[{index}/{self.variants}] " if self.variants else ""
        if getattr(cfg, "seed", None) is not None and len(self._runs) > 1 and not self.variants:
            prefix = f"seed {cfg.seed}: "  # several runs at once (fednorm run --seeds): say whose line it is
        acc = record.metrics.get("test_accuracy")
        acc_txt = "n/a" if acc is None else f"{100 * acc:.2f}%"
        eps = record.metrics.get("dp/epsilon")  # a DP run's accuracy is read with the privacy it cost
        eps_txt = "" if eps is None else f", epsilon {eps:.3g} at delta {record.metrics.get('dp/delta', float('nan')):g}"
        line = (f"{prefix}{cfg.method}+{cfg.norm} round {record.server_round}/{cfg.rounds}: test accuracy {acc_txt}"
                f"{eps_txt}, elapsed {format_seconds(elapsed)}, ETA {format_seconds(eta)}")
        stream = self.stream or sys.stdout
        print(line, file=stream, flush=True)


class OverallBar(Callback):
    """On a terminal, one bar over every run of ``fednorm compare`` or a multi-seed run (rounds
    of all runs together), above each run's own bar.

    Args:
        runs: how many runs will report.
        rounds: rounds per run.
        file: where the bar goes (default: tqdm's, stderr).
    """

    def __init__(self, runs: int, rounds: int, file: TextIO | None = None, desc: str = "all runs") -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=runs * rounds, desc=desc, unit="round", position=0, file=file, leave=True)
        self._runs = 0
        self.runs = runs

    def on_run_start(self, sim: Any, run_dir: Any) -> None:
        self._runs += 1
        self.bar.set_postfix_str(f"run {self._runs}/{self.runs}: {sim.config.method}+{sim.config.norm} seed {sim.config.seed}")
        if sim.server_round:  # a resumed run: its finished rounds count as done
            self.bar.update(sim.server_round)

    def on_round_end(self, record: Any, sim: Any) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
