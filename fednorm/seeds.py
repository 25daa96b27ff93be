"""One experiment over several seeds: a run directory per seed, and mean ± std of every summary
metric (the way FL papers report results).

``run_seeds`` runs (or resumes, or reuses) ``ROOT/seed<k>`` for each seed ``k``; a seed whose
run finished is never rerun, an interrupted one continues from its checkpoint. It writes
``ROOT/seeds.json`` and ``ROOT/seeds.csv`` (each metric's mean, sample std, min, max and the
per-seed values) and ``ROOT/accuracy_seeds.png`` (the mean test-accuracy curve with a ±std band).

``compare_seeds`` (``fednorm compare --seeds``) does this for every variant of a comparison,
``ROOT/<variant>/seed<k>``, and writes one mean ± std table over the variants
(``results.md``, ``results.csv``, ``results.json``) and their curves with ±std bands.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["SeedStats", "SeedsResult", "SeedsComparison", "run_seeds", "compare_seeds", "summarize_seeds", "load_run",
           "plot_seed_comparison"]

#: Summary metrics aggregated over seeds (those a run's summary.json has), as fractions.
METRICS = ("final_test_accuracy", "best_test_accuracy", "last10_mean_test_accuracy", "final_mean_client_accuracy",
           "final_test_loss",
           # with validation_fraction (fednorm/engine/validation.py): the test accuracy at the round of the best
           # validation accuracy, and a personalized method's mean over clients at each one's own best round
           "best_val_test_accuracy", "best_val_mean_client_accuracy", "client_best_val_mean_accuracy")
# Per-client accuracies of feature-shift runs summarised per source: (summary key, metric prefix).
_PER_SOURCE = (("final_client_accuracies", "final_accuracy"), ("best_val_client_accuracies", "best_val_test_accuracy"))


@dataclass
class SeedStats:
    """One metric over the seeds: mean, sample std (0 for one seed), min, max, per-seed values."""

    mean: float
    std: float
    min: float
    max: float
    values: dict[int, float]


@dataclass
class SeedsResult:
    """What :func:`run_seeds` returns: the root folder, each seed's run directory, summary and
    history, and the statistics per metric (plus per domain where the runs have domains)."""

    root: Path
    runs: dict[int, Path]
    summaries: dict[int, dict[str, Any]]
    histories: dict[int, list[dict[str, Any]]]
    stats: dict[str, SeedStats] = field(default_factory=dict)
    reused: list[int] = field(default_factory=list)
    stop_signal: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the seeds, else None."""
    command: str | None = None
    """The command that made the seeds and continues them."""
    stacking: dict[str, Any] = field(default_factory=dict)
    """How the seeds ran (:func:`fednorm.api.run_set.run_stacked`): joint and separate rounds, or why not stacked."""

    def table(self) -> str:
        """A plain-text table of the metrics in %: mean ± std (min–max) over the seeds."""
        seeds = ", ".join(str(s) for s in self.runs)
        lines = [f"{len(self.runs)} seed(s) ({seeds}), {self.root}:"]
        for name, st in self.stats.items():
            scale = 1.0 if name.endswith("loss") else 100.0
            unit = "" if name.endswith("loss") else "%"
            lines.append(f"  {name:<34} {scale * st.mean:7.2f}{unit} ± {scale * st.std:5.2f}"
                         f"  ({scale * st.min:.2f}–{scale * st.max:.2f})")
        return "\n".join(lines)


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run directory's ``summary.json`` and the evaluations of its ``metrics.jsonl`` (an older
    summary's last-10 recomputed from them: :func:`fednorm.engine.last_rounds.upgrade_summary`)."""
    from .engine.last_rounds import upgrade_summary

    d = Path(run_dir)
    summary = json.loads((d / "summary.json").read_text())
    history = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return upgrade_summary(summary, history), history


def _one_copy(configs: Sequence[Any], run_kwargs: dict[str, Any]) -> list[Any] | None:
    """The seeds' client data over one copy of the dataset (each seed's own split), where the
    seeds differ only in how the samples are split; else None (each run builds its own)."""
    from .data.federated import federated_data_from_config, repartition
    from .engine.stacked_runs import stack_blockers

    if "data" in run_kwargs or stack_blockers(configs):
        return None
    first = federated_data_from_config(configs[0])
    return [first, *(repartition(first, c) for c in configs[1:])]


def _finished(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def _stats(values: dict[int, float]) -> SeedStats | None:
    clean = {s: v for s, v in values.items() if v is not None and not math.isnan(v)}
    if not clean:
        return None
    xs = list(clean.values())
    return SeedStats(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, min(xs), max(xs), clean)


def summarize_seeds(summaries: dict[int, dict[str, Any]]) -> dict[str, SeedStats]:
    """Mean, sample std, min and max over seeds of every metric in :data:`METRICS` a run recorded,
    and, for feature-shift runs (``client_sources``), of each source's accuracy: the mean over its
    clients' own test accuracies, as FedBN's Table 11 reports per domain, at the last round
    (``final_accuracy[<source>]``) and, with validation, at the best validation round
    (``best_val_test_accuracy[<source>]``, FedBN's rule for Office-Caltech10 and DomainNet)."""
    out: dict[str, SeedStats] = {}
    for name in METRICS:
        st = _stats({s: summ.get(name) for s, summ in summaries.items()})
        if st is not None:
            out[name] = st
    for key, prefix in _PER_SOURCE:
        per_source: dict[str, dict[int, float]] = {}
        for seed, summ in summaries.items():
            sources, accs = summ.get("client_sources"), summ.get(key)
            if not sources or not accs:
                continue
            groups: dict[str, list[float]] = {}
            for src, acc in zip(sources, accs):
                if acc is not None:
                    groups.setdefault(src, []).append(acc)
            for src, vals in groups.items():
                per_source.setdefault(src, {})[seed] = statistics.fmean(vals)
        for src in sorted(per_source):
            st = _stats(per_source[src])
            if st is not None:
                out[f"{prefix}[{src}]"] = st
    return out


def run_seeds(
    config: Any,
    seeds: Iterable[int],
    root: str | Path,
    *,
    run: Callable[..., Any] | None = None,
    plot: bool = True,
    stack: bool = True,
    model: Any = None,
    data: Any = None,
    command: str | None = None,
    **run_kwargs: Any,
) -> SeedsResult:
    """Run ``config`` once per seed in ``root/seed<k>`` and aggregate.

    Args:
        config: an :class:`~fednorm.config.ExperimentConfig`, a mapping of fields, a YAML path, or
            None for the defaults, as :func:`fednorm.run` takes it (its ``seed`` and ``out`` are replaced).
        seeds: the seeds, e.g. ``[0, 1, 2]``.
        root: the folder of the per-seed run directories and of the aggregate files.
        run: the function that runs one experiment (default :func:`fednorm.api.run`); it is called
            as ``run(config, **run_kwargs)`` for a new seed and ``run(resume=dir, **run_kwargs)``
            for an interrupted one.
        plot: draw ``accuracy_seeds.png``.
        stack: train the seeds that still have rounds to run together, as one computation
            (:mod:`fednorm.engine.stacked_runs`; equal to running them one by one to float
            rounding); where they cannot stack, the reason is in ``SeedsResult.stacking`` and they
            run one by one. Ignored with a custom ``run``.
        model: as :func:`fednorm.run`'s: a registry name, or your own ``nn.Module`` or factory.
            A factory (a class, a lambda) gives each seed its own initial weights; every seed
            of a module instance starts from that module's weights.
        data: your own :class:`~fednorm.data.federated.FederatedData`, as :func:`fednorm.run`'s:
            every seed trains on it, so the seeds differ in initialisation (with a factory),
            batches and client sampling, not in how the samples are split.
    """
    from .api import run as api_run
    from .config import ExperimentConfig

    run = run or api_run
    root = Path(root)
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if not seeds:
        raise ValueError("run_seeds needs at least one seed")
    if config is None or isinstance(config, (str, os.PathLike)):  # the default config, or a YAML file, as fednorm.run takes them
        from .api import resolve_config

        config = resolve_config(config)
    base = config.model_dump() if isinstance(config, ExperimentConfig) else dict(config)
    # config fields given as keywords (partition="iid") are the seeds' config: folded in here, so
    # the data the stacked seeds share is built from the config each seed records and trains
    # (they stay in run_kwargs too: a resumed seed takes them as fednorm.run(resume=...) does)
    base.update({k: v for k, v in run_kwargs.items() if k in ExperimentConfig.model_fields and k not in ("seed", "out")})
    if model is not None:
        from .models.user import UserModel

        # checked once, here: the stacked seeds' threads then build from it without touching the global RNG
        run_kwargs["model"] = model if isinstance(model, (str, UserModel)) else UserModel(model)
    if data is not None:
        run_kwargs["data"] = data
    result = SeedsResult(root=root, runs={s: root / f"seed{s}" for s in seeds}, summaries={}, histories={}, command=command)
    todo = [s for s in seeds if not _finished(root / f"seed{s}")]
    _write(result, running=set(todo))
    result.runs = {}
    if stack and run is api_run and len(todo) > 1:
        from .api.run_set import run_stacked

        configs = [ExperimentConfig(**{**base, "seed": s, "out": str(root / f"seed{s}")}) for s in todo]
        resumes = [root / f"seed{s}" if (root / f"seed{s}" / "checkpoint.pt").exists() else None for s in todo]
        shared = {k: v for k, v in run_kwargs.items() if k != "data"}  # run_stacked takes the data per run
        per_run = [data] * len(configs) if data is not None else _one_copy(configs, run_kwargs)
        outcomes, result.stacking = run_stacked(configs, resume=resumes, data=per_run, again=command, **shared)
        result.stop_signal = result.stacking.get("stop_signal")
        failures = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, KeyboardInterrupt)]
        if failures:  # every other seed has finished and written its run: now say what failed, as alone
            raise failures[0]
        if result.stop_signal is None and any(isinstance(o, KeyboardInterrupt) for o in outcomes):
            raise KeyboardInterrupt
        stacked = set(todo)
    else:
        stacked = set()
    stopped = False
    for seed in seeds:
        d = root / f"seed{seed}"
        result.runs[seed] = d
        if seed in stacked:
            pass  # trained above, with the others
        elif stopped:
            continue  # the set was stopped before this seed started: listed, not run
        elif _finished(d):
            result.reused.append(seed)
        elif (d / "checkpoint.pt").exists():
            res = run(resume=d, **run_kwargs)
            result.stop_signal = getattr(res, "stop_signal", None)
        else:
            res = run(ExperimentConfig(**{**base, "seed": seed, "out": str(d)}), overwrite=True, **run_kwargs)  # unfinished
            result.stop_signal = getattr(res, "stop_signal", None)
        if not (d / "summary.json").is_file():
            continue  # stopped before it started
        result.summaries[seed], result.histories[seed] = load_run(d)
        if result.summaries[seed].get("status") != "completed":  # interrupted: the rest wait, resumable
            stopped = True
    result.stats = summarize_seeds({s: v for s, v in result.summaries.items() if v.get("status") == "completed"})
    _write(result)
    if plot and result.histories:
        plot_seed_curves(result.histories, root / "accuracy_seeds.png",
                         title=f"{base.get('method')} + {base.get('norm')} on {base.get('dataset')}, {len(result.histories)} seed(s)")
    return result


def _write(result: SeedsResult, running: set[int] = frozenset()) -> None:
    """``seeds.json`` and ``seeds.csv``; ``running``: the seeds about to train (written first)."""
    result.root.mkdir(parents=True, exist_ok=True)
    payload = {
        "seeds": list(result.runs),
        "command": result.command,
        "runs": {str(s): str(d) for s, d in result.runs.items()},
        "status": {str(s): "running" if s in running else result.summaries.get(s, {}).get(
                       "status", "completed" if _finished(d) else "not started") for s, d in result.runs.items()},
        "metrics": {name: {"mean": st.mean, "std": st.std, "min": st.min, "max": st.max,
                           "values": {str(s): v for s, v in st.values.items()}}
                    for name, st in result.stats.items()},
    }
    (result.root / "seeds.json").write_text(json.dumps(payload, indent=2) + "\n")
    with open(result.root / "seeds.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        seeds = list(result.runs)
        w.writerow(["metric", "mean", "std", "min", "max", *[f"seed{s}" for s in seeds]])
        for name, st in result.stats.items():
            w.writerow([name, st.mean, st.std, st.min, st.max, *[st.values.get(s, "") for s in seeds]])


def mean_std_curve(histories: dict[int, Sequence[dict[str, Any]]], key: str = "test_accuracy"
                   ) -> tuple[list[int], list[float], list[float]]:
    """Rounds every seed evaluated, and the mean and sample std (0 for one seed) of ``key`` there."""
    common = sorted(set.intersection(*[{h["round"] for h in hist} for hist in histories.values()]))
    per_round = {r: [next(h[key] for h in hist if h["round"] == r) for hist in histories.values()] for r in common}
    clean = {r: [v for v in vs if v is not None and not math.isnan(v)] for r, vs in per_round.items()}
    rounds = [r for r in common if clean[r]]
    means = [statistics.fmean(clean[r]) for r in rounds]
    stds = [statistics.stdev(clean[r]) if len(clean[r]) > 1 else 0.0 for r in rounds]
    return rounds, means, stds


def plot_seed_curves(histories: dict[int, Sequence[dict[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Mean test accuracy over the seeds against rounds, with a ±std band (rounds every seed evaluated)."""
    return plot_seed_comparison({f"mean of {len(histories)} seed(s)": histories}, path, title)


def plot_seed_comparison(histories: dict[str, dict[int, Sequence[dict[str, Any]]]], path: str | Path, title: str = "") -> Path:
    """One mean test-accuracy curve per variant, each with its ±std band over the seeds."""
    from .plotting import plot_curves

    curves = {}
    for label, per_seed in histories.items():
        if per_seed:
            rounds, means, stds = mean_std_curve(per_seed)
            curves[label] = (rounds, [100 * m for m in means], [100 * s for s in stds])
    return plot_curves(curves, path, title, ylabel="test accuracy (%), mean ± std over seeds")


# Columns of the comparison table: (metric, header).
TABLE = (("final_test_accuracy", "final acc (%)"), ("best_test_accuracy", "best acc (%)"),
         ("last10_mean_test_accuracy", "last-10 rounds acc (%)"), ("final_mean_client_accuracy", "mean client acc (%)"))
# Columns added when some variant recorded them (runs with validation_fraction).
VALIDATED = (("best_val_test_accuracy", "acc at best val (%)"),
             ("client_best_val_mean_accuracy", "client acc at own best val (%)"))


@dataclass
class SeedsComparison:
    """What :func:`compare_seeds` returns: each variant's :class:`SeedsResult` (its runs under
    ``root/<variant>/seed<k>``) and the table over them."""

    root: Path
    seeds: list[int]
    results: dict[str, SeedsResult]
    evaluation: dict[str, str] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return self.stop_signal is not None or any(
            s.get("status") == "interrupted" for r in self.results.values() for s in r.summaries.values())

    @property
    def stop_signal(self) -> int | None:
        """The signal that stopped the comparison (SIGINT, SIGTERM), else None."""
        return next((r.stop_signal for r in self.results.values() if r.stop_signal is not None), None)

    def rows(self) -> list[dict[str, Any]]:
        """One row per (variant, metric): mean, sample std, min, max, n and every seed's value."""
        out = []
        for label, res in self.results.items():
            for name, st in res.stats.items():
                out.append({"variant": label, "metric": name, "mean": st.mean, "std": st.std, "min": st.min,
                            "max": st.max, "n": len(st.values),
                            **{f"seed{s}": st.values.get(s) for s in self.seeds}})
        return out

    def markdown(self) -> str:
        """The table: mean ± std (in %) of the final, best, last-10 and mean per-client accuracy, and
        where a variant validated (``validation_fraction``) the test accuracy at the best validation
        round (a personalized variant: the mean over clients, each at its own best round)."""
        table = TABLE + tuple(c for c in VALIDATED if any(c[0] in r.stats for r in self.results.values()))
        head = "| variant | evaluated | seeds | " + " | ".join(h for _, h in table) + " |"
        lines = [head, "|---|---|---:|" + "---:|" * len(table)]
        for label, res in self.results.items():
            cells = []
            for name, _ in table:
                st = res.stats.get(name)
                cells.append("n/a" if st is None else f"{100 * st.mean:.2f} ± {100 * st.std:.2f}")
            n = len([s for s in res.summaries.values() if s.get("status") == "completed"])
            lines.append(f"| {label} | {self.evaluation.get(label, '')} | {n} | " + " | ".join(cells) + " |")
        lines.append(f"\nMean ± sample std over seeds {', '.join(map(str, self.seeds))}.")
        from .engine.last_rounds import last10_note

        note = last10_note((s, None) for res in self.results.values() for s in res.summaries.values())
        if note:  # a column of n/a says why, and how to fill it
            lines.append(note)
        if self.not_run:
            lines.append(f"Not run (stopped): {', '.join(self.not_run)}.")
        return "\n".join(lines)

    def write(self) -> None:
        """``results.md``, ``results.csv`` (one row per variant and metric), ``results.json``."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "results.md").write_text(self.markdown() + "\n")
        rows = self.rows()
        with open(self.root / "results.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["variant", "metric", "mean", "std", "min", "max", "n",
                                               *[f"seed{s}" for s in self.seeds]])
            w.writeheader()
            w.writerows(rows)
        payload = {"seeds": self.seeds,
                   "variants": {label: {"dir": str(res.root), "evaluation": self.evaluation.get(label),
                                        "runs": {str(s): str(d) for s, d in res.runs.items()},
                                        "metrics": {name: {"mean": st.mean, "std": st.std, "min": st.min, "max": st.max,
                                                           "values": {str(s): v for s, v in st.values.items()}}
                                                    for name, st in res.stats.items()}}
                                for label, res in self.results.items()},
                   "not_run": self.not_run}
        (self.root / "results.json").write_text(json.dumps(payload, indent=2) + "\n")


def compare_seeds(
    planned: Sequence[tuple[str, Any]],
    seeds: Iterable[int],
    root: str | Path,
    *,
    plot: bool = True,
    title: str = "",
    **run_kwargs: Any,
) -> SeedsComparison:
    """Run every variant once per seed, ``root/<variant>/seed<k>``, and tabulate mean ± std.

    Args:
        planned: ``(label, config)`` pairs, as :func:`fednorm.api.plan_variants` returns them
            (each config's ``out`` is the variant's folder).
        seeds: the seeds.
        root: the comparison's folder (``results.md``, ``results.csv``, ``results.json``,
            ``accuracy.png``).
        run_kwargs: passed to :func:`run_seeds` (``progress``, ``on_round``, ...).

    Finished seeds are kept (rerunning continues where it stopped); an interrupted variant stops
    the comparison, with the variants not yet run listed in ``not_run``.
    """
    from .methods import METHODS

    root = Path(root)
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    comparison = SeedsComparison(root=root, seeds=seeds, results={})
    for i, (label, cfg) in enumerate(planned):
        res = run_seeds(cfg, seeds, Path(cfg.out), plot=plot, **run_kwargs)
        comparison.results[label] = res
        personalized = getattr(METHODS.get_builder(cfg.method), "personalized", False)
        comparison.evaluation[label] = "per client" if personalized else "global"
        if res.stop_signal is not None or any(s.get("status") == "interrupted" for s in res.summaries.values()):
            comparison.not_run = [lab for lab, _ in planned[i + 1:]]
            break
    comparison.write()
    if plot and comparison.results:
        plot_seed_comparison({label: r.histories for label, r in comparison.results.items()}, root / "accuracy.png",
                             title=title)
    return comparison
