"""Find the run directories under any set of folders and group them into variants.

A run directory is a folder with ``config.yaml`` and ``summary.json`` (fednorm.engine.outputs).
Runs whose configs are the same but for the seed (and settings that do not change results:
threads, device, output folder, loggers, ...) are one *variant*; its statistics are mean ± std
over its completed runs (:func:`fednorm.seeds.summarize_seeds`). This reads what ``fednorm run``,
``run --seeds``, ``compare`` (with or without ``--seeds``) and ``fednorm reproduce`` write, without
needing to know which one wrote it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..errors import ConfigError
from ..seeds import SeedStats, summarize_seeds

__all__ = ["Run", "Variant", "find_runs", "group_runs"]

# Settings that do not change a run's results: runs differing only in these (and the seed) are one variant.
NOT_RESULTS = ("seed", "out", "threads", "device", "log", "log_args", "checkpoint_every", "data_dir", "download",
               "eval_batch_size", "max_parallel_clients", "executor", "channels_last")


@dataclass
class Run:
    """One run directory, read back."""

    dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    partition: dict[str, Any] | None = None

    @property
    def completed(self) -> bool:
        return self.summary.get("status") == "completed"


@dataclass
class Variant:
    """Runs of one setting over seeds, and mean ± std of their summary metrics."""

    label: str
    runs: list[Run]
    stats: dict[str, SeedStats] = field(default_factory=dict)
    personalized: bool = False

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.completed]

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config


def _read_run(d: Path) -> Run | None:
    try:
        config = yaml.safe_load((d / "config.yaml").read_text()) or {}
        summary = json.loads((d / "summary.json").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    history: list[dict[str, Any]] = []
    if (d / "metrics.jsonl").is_file():
        for line in (d / "metrics.jsonl").read_text().splitlines():
            try:
                history.append(json.loads(line))
            except ValueError:  # a line cut by a crash: the rest of the file is still good
                continue
    partition = None
    if (d / "partition.json").is_file():
        try:
            partition = json.loads((d / "partition.json").read_text())
        except ValueError:
            partition = None
    return Run(d, config, summary, history, partition)


def find_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run directory at or under ``paths`` (each once, in path order).

    Raises:
        ConfigError: a path does not exist, or no run directory is found at all.
    """
    seen: set[Path] = set()
    runs: list[Run] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p} does not exist")
        candidates = [p] if (p / "summary.json").is_file() else sorted(s.parent for s in p.rglob("summary.json"))
        for d in candidates:
            key = d.resolve()
            if key in seen or not (d / "config.yaml").is_file():
                continue
            seen.add(key)
            run = _read_run(d)
            if run is not None:
                runs.append(run)
    if not runs:
        raise ConfigError(f"no run directory (a folder with config.yaml and summary.json) under {', '.join(map(str, paths))}")
    return runs


def _key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if k not in NOT_RESULTS}, sort_keys=True, default=str)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"method_args.mode": "literal", ...}``: nested options as dotted keys, values as JSON."""
    out: dict[str, str] = {}
    for k, v in config.items():
        if prefix == "" and k in NOT_RESULTS:
            continue
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def _labels(configs: list[dict[str, Any]]) -> list[str]:
    """``method+norm``, plus the settings that tell apart the variants of the same method and
    norm (``fedavg+bn (alpha=0.1)``); a setting shared by all of them is left out."""
    flats = [_flat(c) for c in configs]
    family = [f"{c.get('method')}+{c.get('norm')}" for c in configs]
    labels = []
    for i, flat in enumerate(flats):
        same = [flats[j] for j in range(len(flats)) if family[j] == family[i]]
        keys = sorted({k for f in same for k in f} - {"method", "norm"})
        varying = [k for k in keys if len({f.get(k) for f in same}) > 1]
        extra = [f"{k}={json.loads(flat[k]) if k in flat else None}" for k in varying]
        labels.append(family[i] + (f" ({', '.join(extra)})" if extra else ""))
    return labels


def group_runs(runs: list[Run]) -> list[Variant]:
    """The runs grouped into variants (first-seen order), each labelled ``method+norm`` plus
    the settings that differ between variants, with its statistics over completed runs."""
    from ..methods import METHODS

    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(_key(run.config), []).append(run)
    variants = []
    for members, label in zip(groups.values(), _labels([g[0].config for g in groups.values()])):
        done = {i: r.summary for i, r in enumerate(members) if r.completed}
        try:
            personalized = bool(getattr(METHODS.get_builder(str(members[0].config.get("method"))), "personalized", False))
        except ValueError:
            personalized = False
        variants.append(Variant(label, members, summarize_seeds(done), personalized))
    return variants
