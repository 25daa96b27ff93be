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
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

from .. import yaml_io
from ..config_roles import NOT_RESULT_FIELDS
from ..errors import ConfigError
from ..seeds import SeedStats, summarize_seeds

__all__ = ["Run", "Settings", "Variant", "describe_variants", "find_runs", "group_runs"]

# Settings that do not change a run's results: runs differing only in these (and the seed) are one variant.
NOT_RESULTS = NOT_RESULT_FIELDS
MAX_LABEL = 64  # characters a variant's label is shortened to when it can be: one line of a table cell or a legend
MAX_LABEL_CUT = 96  # characters past which a label is cut (two lines of a table cell or a legend)
MAX_VALUE = 20  # characters of one setting's value in a label that would be longer (the report lists it in full)


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
    #: the settings that differ between the variants of a report -> this variant's value, in full
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.completed]

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config


def _read_run(d: Path) -> Run | None:
    try:
        return _read_run_or_say_why(d)
    except ConfigError:
        return None


#: Files that show a folder holds a run even before its ``summary.json`` (written when it ends).
_RUN_EVIDENCE = ("summary.json", "checkpoint.pt", "checkpoint.prev.pt", "metrics.jsonl")


def _why_not(d: Path) -> str | None:
    """Why the run directory ``d`` cannot be reported, with what to do; None when it can."""
    if not (d / "config.yaml").is_file():
        return f"{d} has a summary.json but no config.yaml"
    if not (d / "summary.json").is_file():
        from ..engine.runlock import describe_holder, is_locked

        holder = is_locked(d)
        if holder is not None:
            return (f"{d} is a run still training ({describe_holder(holder)}); it writes its summary.json when it ends: "
                    "report it then (one Ctrl-C stops it after its round, with a summary)")
        return (f"{d} is a run that stopped before it finished (no summary.json: killed?); continue it with "
                f"`fednorm run --resume {d}`, then report it")
    for name in ("summary.json", "config.yaml"):
        try:
            text = (d / name).read_text()
            value = json.loads(text) if name.endswith(".json") else yaml_io.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            problem = " ".join(str(getattr(exc, "problem", None) or getattr(exc, "msg", None) or exc).split())[:80]
            fix = (f"`fednorm run --resume {d}` writes it again from the run's last checkpoint" if name == "summary.json"
                   else "restore it from a copy of the run")
            return f"{d}/{name} is corrupt ({problem}); {fix}"
        if not isinstance(value, dict) and not (name == "config.yaml" and value is None):
            return f"{d}/{name} is corrupt (it holds no mapping)"
    return None


def _read_run_or_say_why(d: Path) -> Run:
    """The run in ``d``; :class:`ConfigError` saying why not and what to do (a run still training,
    one that was killed, a corrupt ``summary.json``: issue 50)."""
    why = _why_not(d)
    if why is not None:
        raise ConfigError(why)
    config = yaml_io.safe_load((d / "config.yaml").read_text()) or {}
    summary = json.loads((d / "summary.json").read_text())
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
    from ..engine.last_rounds import upgrade_summary

    return Run(d, config, upgrade_summary(summary, history), history, partition)


def _candidates(p: Path) -> list[Path]:
    """``p`` when it is a run directory, else every run directory under it (finished or not)."""
    if (p / "summary.json").is_file() or ((p / "config.yaml").is_file() and any((p / n).exists() for n in _RUN_EVIDENCE)):
        return [p]
    found = {s.parent for name in ("summary.json", "config.yaml") for s in p.rglob(name)}
    return sorted(d for d in found if any((d / n).exists() for n in _RUN_EVIDENCE))


def find_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run directory at or under ``paths`` (each once, in path order).

    A ``RUN_DIR`` given itself that cannot be reported (still training, killed before it ended,
    a corrupt ``summary.json``) is an error saying so and what to do; one found under a folder
    is left out with a warning saying why.

    Raises:
        ConfigError: a path does not exist, a given run directory cannot be reported, or no run
            directory is found at all.
    """
    import warnings

    seen: set[Path] = set()
    runs: list[Run] = []
    skipped: list[str] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p} does not exist")
        candidates = _candidates(p)
        for d in candidates:
            key = d.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                runs.append(_read_run_or_say_why(d))
            except ConfigError as exc:
                if d == p:  # the run asked for by name: say why it cannot be reported
                    raise
                skipped.append(str(exc))
    if not runs:
        why = (f": {skipped[0]}" + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else "")) if skipped else ""
        raise ConfigError(f"no run directory (a folder with config.yaml and summary.json) under "
                          f"{', '.join(map(str, paths))}{why}")
    for text in skipped:
        warnings.warn(f"left out {text}", stacklevel=2)
    return runs


@lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    from ..config import ExperimentConfig

    return ExperimentConfig().model_dump(mode="json")


def _filled(config: dict[str, Any]) -> dict[str, Any]:
    """The config with every field it lacks at its default: a run recorded before a field existed
    ran as that field's default does, so it neither splits a variant nor shows as a difference."""
    return {**_defaults(), **config}


def _key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in _filled(config).items() if k not in NOT_RESULTS}, sort_keys=True, default=str)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"method_args.mode": "literal", ...}``: nested options as dotted keys, values as JSON
    (an empty mapping is no setting at all)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        if prefix == "" and k in NOT_RESULTS:
            continue
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def _show(value: str) -> str:
    """A flat value as a person reads it: strings bare, anything else as compact JSON."""
    v = json.loads(value)
    return v if isinstance(v, str) else json.dumps(v, separators=(", ", ": "))


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, the cut marked by an ellipsis in the middle (a path's or a
    list's both ends tell more than its start alone)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def _separating(flats: list[dict[str, str]], heads: list[str], keys: list[str]) -> list[str]:
    """A small subset of ``keys`` that, with the heads, still tells every variant apart, in ``keys``
    order: greedily the key that separates the most pairs not yet separated, a key with values
    past :data:`MAX_VALUE` characters counting for less (``lr=0.05`` before a list of twelve
    milestones); on a tie the key more variants have, then the earlier one."""
    pairs = {(i, j) for i in range(len(flats)) for j in range(i + 1, len(flats)) if heads[i] == heads[j]}
    have = {k: sum(k in f for f in flats) for k in keys}
    cost = {k: max(1.0, sum(len(_show(f[k])) for f in flats if k in f) / max(1, have[k]) / MAX_VALUE) for k in keys}
    chosen: list[str] = []
    while pairs:
        score = {k: (sum(flats[i].get(k) != flats[j].get(k) for i, j in pairs) / cost[k], have[k], -n)
                 for n, k in enumerate(keys) if k not in chosen}
        best = max(score, key=score.__getitem__, default=None)
        if best is None or score[best][0] == 0:
            break
        chosen.append(best)
        pairs = {(i, j) for i, j in pairs if flats[i].get(best) == flats[j].get(best)}
    return [k for k in keys if k in chosen]


@dataclass
class Settings:
    """What tells a report's variants apart (:func:`describe_variants`).

    Attributes:
        labels: one short, unique label per variant (:data:`MAX_LABEL` characters where the
            steps of :func:`describe_variants` get it there, never more than :data:`MAX_LABEL_CUT`).
        differing: per variant, every setting that is not the same in all variants -> its value
            in full (a setting a variant lacks, such as another method's option, is left out).
        common: the settings equal in every variant -> value, to list once.
        usual: each differing setting's usual value (the one most variants have), which a label
            may leave out; empty when labels name every differing setting. A report lists them
            once, and per variant only the settings off their usual value.
        complete: whether every label names all of its variant's differing settings in full; if
            not, a report lists them (:attr:`differing`) beside the labels.
    """

    labels: list[str]
    differing: list[dict[str, str]]
    common: dict[str, str]
    usual: dict[str, str] = field(default_factory=dict)
    complete: bool = True


def describe_variants(configs: list[dict[str, Any]]) -> Settings:
    """Short unique labels for variants of any settings, and the settings they all share.

    A label is ``method+norm`` followed by the settings that differ between the variants shown
    (``fedavg+bn (lr=0.05, alpha=0.1)``), never the settings all of them share (a run's config has
    70 fields: listing them made labels of 800 characters). Past :data:`MAX_LABEL` characters, in
    this order until the labels fit: a setting at its usual value (the one most variants have) is
    left out, a nested option goes by its last name (``mode`` for ``method_args.mode``) where that
    is unambiguous, only a subset of the settings that still tells every variant apart is named
    (:func:`_separating`), and long values are shortened. A label still past
    :data:`MAX_LABEL_CUT` is cut, and labels a cut made equal are numbered.
    Labels stay unique at every step: two variants that differ in a setting cannot both have its
    usual value, so one of them names it.
    """
    flats = [_flat(_filled(c)) for c in configs]
    keys = list(dict.fromkeys(k for f in flats for k in f))  # config order
    common = {k: _show(flats[0][k]) for k in keys if all(k in f and f[k] == flats[0][k] for f in flats)}
    varying = [k for k in keys if k not in common]
    differing = [{k: _show(f[k]) for k in varying if k in f} for f in flats]
    heads = [f"{c.get('method')}+{c.get('norm')}" for c in configs]
    rest = [k for k in varying if k not in ("method", "norm")]
    usual = {k: Counter(d[k] for d in differing if k in d).most_common(1)[0][0] for k in rest}
    # Leaving out a usual value keeps labels unique only where, among variants of one head, no
    # variant lacks the setting (else "lacks it" and "has the usual value" would read the same).
    skippable = {k for k in rest if all(len({k in d for d, h in zip(differing, heads) if h == head}) == 1 for head in set(heads))}
    last = Counter(k.rsplit(".", 1)[-1] for k in rest)
    short = {k: k.rsplit(".", 1)[-1] if last[k.rsplit(".", 1)[-1]] == 1 and k.rsplit(".", 1)[-1] not in keys else k for k in rest}

    def build(names: list[str], skip_usual: bool = False, short_keys: bool = False, value_limit: int | None = None) -> list[str]:
        out = []
        for head, d in zip(heads, differing):
            shown = [k for k in names if k in d and not (skip_usual and k in skippable and d[k] == usual[k])]
            parts = [f"{short[k] if short_keys else k}={d[k] if value_limit is None else _clip(d[k], value_limit)}" for k in shown]
            out.append(head + (f" ({', '.join(parts)})" if parts else ""))
        return out

    fewer = lru_cache(maxsize=1)(lambda: _separating(flats, heads, rest))  # O(variants² · settings): only when needed
    steps = [lambda: build(rest, True), lambda: build(rest, True, True), lambda: build(fewer(), True, True),
             lambda: build(fewer(), True, True, MAX_VALUE)]
    labels, step = build(rest), 0
    while step < len(steps) and max(map(len, labels), default=0) > MAX_LABEL:
        labels, step = steps[step](), step + 1
    cut = any(len(label) > MAX_LABEL_CUT for label in labels)
    labels = [_clip(label, MAX_LABEL_CUT) for label in labels]
    counts = Counter(labels)
    if len(counts) < len(labels):  # a cut (or two values that read the same) made labels equal: number them
        labels = [label if counts[label] == 1 else f"{_clip(label, MAX_LABEL_CUT - 5)} #{i + 1}" for i, label in enumerate(labels)]
    complete = step == 0 and not cut and len(counts) == len(labels)
    usual = usual if step > 0 else {}
    return Settings(labels, differing, common, usual, complete)


def _labels(configs: list[dict[str, Any]]) -> list[str]:
    """The labels of :func:`describe_variants` alone."""
    return describe_variants(configs).labels


def group_runs(runs: list[Run]) -> list[Variant]:
    """The runs grouped into variants (first-seen order), each labelled ``method+norm`` plus
    the settings that differ between variants (:func:`describe_variants`), with its statistics
    over completed runs."""
    from ..methods import METHODS

    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(_key(run.config), []).append(run)
    described = describe_variants([g[0].config for g in groups.values()])
    variants = []
    for members, label, differing in zip(groups.values(), described.labels, described.differing):
        done = {i: r.summary for i, r in enumerate(members) if r.completed}
        try:
            personalized = bool(getattr(METHODS.get_builder(str(members[0].config.get("method"))), "personalized", False))
        except ValueError:
            personalized = False
        variants.append(Variant(label, members, summarize_seeds(done), personalized, differing))
    return variants
