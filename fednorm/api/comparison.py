"""Comparing variants: :func:`compare` runs several methods, norms or settings on one setting
(the same data, partition and seed), validating every variant first, and tabulates them."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..config import ExperimentConfig, load_config
from ..config_roles import DATA_OBJECT_FIELDS
from ..data.federated import FederatedData
from ..engine.simulator import Simulation
from ..errors import FednormError
from ..models.user import UserModel
from .inputs import check_data_fields, check_data_type, check_device, record_data, record_model, resolve_config, split_model
from .resume import RESUMABLE_OVERRIDES, check_resumable
from .runs import RunResult, run
from .stop import StopRequest

__all__ = ["CompareResult", "DEFAULT_VARIANTS", "compare", "plan_variants", "variant_label"]


def variant_label(variant: Mapping[str, Any]) -> str:
    """A short label such as ``fedavg+bn`` or ``fedavg+gn(lr=0.1)``."""
    method = variant.get("method", "?")
    norm = variant.get("norm", "?")
    rest = {k: v for k, v in variant.items() if k not in ("method", "norm")}
    extra = "(" + ", ".join(f"{k}={v}" for k, v in rest.items()) + ")" if rest else ""
    return f"{method}+{norm}{extra}"


def _personalized(result: RunResult) -> bool:
    """Whether ``result`` was evaluated per client (a reloaded result has no simulation)."""
    if result.simulation is not None:
        return bool(result.simulation.method.personalized)
    if "personalized" in result.summary:
        return bool(result.summary["personalized"])
    from ..methods import METHODS

    return bool(getattr(METHODS.get_builder(result.config.method), "personalized", False))


@dataclass
class CompareResult:
    """Results of several variants run on the same data, partition and seed."""

    results: dict[str, RunResult]
    out_dir: Path | None
    stop_signal: int | None = None
    """The signal that stopped the comparison early, else None."""
    interrupted: str | None = None
    """The variant a signal stopped (it has a checkpoint and is not in the table)."""
    not_run: list[str] = field(default_factory=list)
    """Variants that did not start because the comparison was stopped."""

    def rows(self) -> list[dict[str, Any]]:
        from ..domain_results import domain_columns, domain_names_of

        rows = []
        domains = domain_names_of([r.summary for r in self.results.values()])
        for label, r in self.results.items():
            s = r.summary
            rows.append(
                {
                    "variant": label,
                    "evaluation": "per client" if _personalized(r) else "global",
                    "final_acc": s["final_test_accuracy"],
                    "best_acc": s["best_test_accuracy"],
                    "last10_acc": s["last10_mean_test_accuracy"],
                    "mean_client_acc": s["final_mean_client_accuracy"],
                    "final_test_loss": s["final_test_loss"],
                    "rounds": s["rounds"],
                    "wall_s": s["wall_seconds"],
                    "uplink_MB": s["uplink_bytes"] / 1e6,
                    **domain_columns(s, domains),  # feature shift: one column per domain
                }
            )
        return rows

    def markdown(self) -> str:
        def pct(v: Any) -> str:
            return "n/a" if v is None else f"{100 * v:.2f}"

        rows = self.rows()
        dom = [k for k in (rows[0] if rows else {}) if k.startswith("acc[")]  # per-domain columns
        lines = [
            "| variant | evaluated | final acc (%) | best acc (%) | last-10 rounds acc (%) | mean client acc (%) | rounds | wall (s) | uplink (MB) |"
            + "".join(f" {k[4:-1]} (%) |" for k in dom),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(dom),
        ]
        for r in rows:
            lines.append(
                f"| {r['variant']} | {r['evaluation']} | {pct(r['final_acc'])} | {pct(r['best_acc'])} | {pct(r['last10_acc'])} | "
                f"{pct(r['mean_client_acc'])} | {r['rounds']} | {r['wall_s']:.1f} | {r['uplink_MB']:.2f} |"
                + "".join(f" {pct(r[k])} |" for k in dom)
            )
        from ..engine.last_rounds import last10_note

        note = last10_note((r.summary, {"eval_every": r.config.eval_every}) for r in self.results.values())
        if note:  # a column of n/a says why, and how to fill it
            lines.append(f"\n{note}")
        if self.stop_signal is not None:
            import signal

            name = signal.Signals(self.stop_signal).name if self.stop_signal in signal.Signals._value2member_map_ else str(self.stop_signal)
            note = f"\nStopped by {name}."
            if self.interrupted:
                note += f" {self.interrupted} was interrupted (its run directory has a checkpoint) and is not in the table."
            if self.not_run:
                note += f" Not run: {', '.join(self.not_run)}."
            lines.append(note)
        return "\n".join(lines)

    def headline(self) -> str:
        """One sentence on what the table shows: FedAvg+BN against the best other variant
        evaluated as one global model (per-client accuracies are not comparable with it)."""
        rows = [r for r in self.rows() if r["evaluation"] == "global" and r["final_acc"] is not None]
        bn = next((r for r in rows if r["variant"].startswith("fedavg+bn")), None)
        others = [r for r in rows if r is not bn]
        if bn is None or not others:
            best = max(rows, key=lambda r: r["final_acc"], default=None)
            return f"Best global model: {best['variant']} ({100 * best['final_acc']:.1f}%)." if best else ""
        best = max(others, key=lambda r: r["final_acc"])
        beaten = sum(r["final_acc"] > bn["final_acc"] for r in others)
        gap = 100 * (best["final_acc"] - bn["final_acc"])
        if gap <= 0:
            return (f"FedAvg with averaged BatchNorm statistics ({100 * bn['final_acc']:.1f}%) leads every other global model "
                    "here: BatchNorm does not break on this setting.")
        return (f"FedAvg with averaged BatchNorm statistics reaches {100 * bn['final_acc']:.1f}%; {beaten} of {len(others)} "
                f"other global models do better, up to {best['variant']} at {100 * best['final_acc']:.1f}% "
                f"(+{gap:.1f} points).")

    def csv(self) -> str:
        buf = io.StringIO()
        rows = self.rows()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["variant"])
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()


# The papers' methods beside FedAvg with BN and GN (`fednorm compare` with no variants).
DEFAULT_VARIANTS: tuple[dict[str, Any], ...] = (
    {"method": "fedavg", "norm": "bn"},
    {"method": "fedavg", "norm": "gn"},
    {"method": "fedavg", "norm": "ln"},
    {"method": "fedavg", "norm": "fn"},
    {"method": "fedbn", "norm": "bn"},
    {"method": "fedtan", "norm": "bn"},
    {"method": "fbn", "norm": "fbn"},
    {"method": "hbn", "norm": "hbn"},
)


def _variant_dir(root: Path, label: str) -> str:
    return str(root / label.replace("+", "_").replace("(", "_").replace(")", "").replace(", ", "_").replace("=", ""))


def plan_variants(base: ExperimentConfig, variants: Sequence[Mapping[str, Any]], root: Path | None, *,
                  model: UserModel | None = None) -> list[tuple[str, ExperimentConfig]]:
    """Each variant's label and full config (run directory under ``root``), every one validated
    (fields, registry names, device; with a user's ``model``, that it converts for the variant's
    norm and method): a typo in the last variant is reported before the first trains."""
    from ..config_roles import USER_DATA_FIELDS
    from ..data.provenance import is_user_dataset
    from ..engine.simulator import check_names
    from ..errors import ConfigError
    from ..models.user import is_user_model, method_norm

    planned: list[tuple[str, ExperimentConfig]] = []
    for variant in variants:
        variant = dict(variant)
        given = variant.pop("label", None)  # a variant may name itself (e.g. the centralized reference)
        if not isinstance(variant.get("model", ""), str):
            shown = {"method": base.method, "norm": base.norm, **{k: v for k, v in variant.items() if k != "model"}}
            raise ConfigError(f"variant {given or variant_label(shown)}: a variant's model "
                              "is a registry name; pass your own nn.Module as fednorm.compare(model=net), which every variant trains")
        full = {"method": base.method, "norm": base.norm, **variant}
        if is_user_model(base.model):  # the norm a user's module runs with under this method
            full["norm"] = method_norm(full["method"], full["norm"])
        label = given or variant_label(full)
        if is_user_model(base.model) and ({"model", "model_args"} & set(variant)):
            raise ConfigError(f"variant {label}: every variant trains the model given as model=; leave model and "
                              "model_args out of the variants (compare another model in its own comparison)")
        changed = sorted(k for k in variant if k in USER_DATA_FIELDS)
        if is_user_dataset(base.dataset) and changed:
            raise ConfigError(f"variant {label}: every variant trains on the data given as data=; it cannot change "
                              f"{', '.join(changed)}")
        try:
            cfg = resolve_config(base, **full, out=_variant_dir(root, label) if root else None)
            check_names(cfg)
            check_device(cfg.device)
            if model is not None:
                _check_builds(cfg, model)
        except ConfigError as exc:
            raise ConfigError(f"variant {label}: {exc}") from None
        planned.append((label, cfg))
    return planned


def compare(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    variants: Sequence[Mapping[str, Any]] = DEFAULT_VARIANTS,
    model: str | nn.Module | Callable[[], nn.Module] | None = None,
    data: FederatedData | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    on_round: Callable[[Any, Simulation], None] | None = None,
    resume: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    **overrides: Any,
) -> CompareResult:
    """Run several variants (method/norm/any field) on one setting and tabulate them.

    Every variant shares the base config's data, partition and seed; the client data is built
    once and reused. Every variant's config is validated (fields and registry names, and that your
    module converts for it) before the first one trains.

    Args:
        config: the base config, as :func:`run` takes it (an :class:`ExperimentConfig`, a mapping,
            or a YAML path as ``str`` or ``os.PathLike``).
        variants: what each variant changes in the base config, e.g. ``{"method": "fedbn",
            "norm": "bn"}`` or ``{"lr": 0.1}``; a ``"label"`` key names it (default: the papers'
            methods beside FedAvg with BN, GN, LN and FN, ``fednorm.api.DEFAULT_VARIANTS``).
        model: as :func:`run`'s: every variant trains its own copy of your module (its
            BatchNorm converted for the variant's norm; left at ``bn``, the ``hbn`` and ``fbn``
            variants convert it to their layers).
        data: as :func:`run`'s: every variant trains on it.
        out: the comparison's directory (``str`` or ``os.PathLike``): ``compare.json`` (the plan),
            ``results.md``, ``results.csv``, ``accuracy.png`` and one run directory per variant
            (default: None, nothing is written).
        progress: show a progress bar per variant (default: only on a terminal).
        on_round: called as ``on_round(record, simulation)`` after every round of every variant.
        resume: a comparison's ``out`` to continue from its ``compare.json``: finished variants
            are kept, the interrupted one resumes from its checkpoint, the rest run (only
            ``fednorm.api.RESUMABLE_OVERRIDES`` may be passed, e.g. ``rounds=`` to extend every
            variant; a comparison of your own model or data resumes with them passed again).
        overwrite: start again in an ``out`` that already holds a comparison, deleting it (its
            table, plan, plot and its variants' run files) once every new variant is known to be
            valid; without it such a directory is refused, as ``fednorm compare`` refuses it
            without ``--overwrite``.
        **overrides: base config fields, e.g. ``rounds=5``.

    Returns:
        A :class:`CompareResult`: ``results`` maps each variant's label (``"fedavg+bn"``,
        ``"fedavg+gn(lr=0.1)"``) to its :class:`RunResult` (its ``summary`` as :func:`run`
        describes it); ``rows()``, ``markdown()`` and ``csv()`` give the table, ``headline()`` one
        sentence on it; ``stop_signal``, ``interrupted`` and ``not_run`` say how a stopped
        comparison ended.

    Raises:
        ConfigError: a variant with an unknown or invalid setting, or one your model cannot
            serve (one line, naming the variant, before anything trains); ``out`` already holds
            a comparison (continue it with ``resume=``, pass ``overwrite=True``, or another
            ``out``) or a single run; ``resume=`` with other settings than the resumable ones.
        DivergenceError, RoundFailedError, RunWriteError: a variant that failed, as :func:`run`
            raises them (the variants before it keep their run directories).

    A SIGINT/SIGTERM stops the comparison after the current round of the current variant: the
    table holds the variants that finished, and ``CompareResult.stop_signal`` the signal.

    Example:
        >>> import torch, fednorm
        >>> from torch import nn
        >>> g = torch.Generator().manual_seed(0)
        >>> clients = [(torch.randn(16, 4, generator=g) + k, torch.arange(16) % 2) for k in range(2)]
        >>> data = fednorm.FederatedData.from_tensors(clients, test=(torch.randn(8, 4, generator=g), torch.arange(8) % 2))
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        >>> variants = [{"method": "fedavg", "norm": "bn"}, {"method": "fedbn", "norm": "bn"}]
        >>> table = fednorm.compare(model=net, data=data, variants=variants, rounds=1, out="runs/cmp", progress=False)
        >>> [(row["variant"], row["evaluation"]) for row in table.rows()]
        [('fedavg+bn', 'global'), ('fedbn+bn', 'per client')]
        >>> again = fednorm.compare(model=net, data=data, variants=variants, rounds=1, lr=0.1, out="runs/cmp",
        ...                         overwrite=True, progress=False)
    """
    import contextlib

    from ..compare_plan import load_plan, save_plan
    from ..engine import rundir
    from ..engine.runlock import run_lock

    check_data_type(data)
    config, user = split_model(config, overrides, model)
    if resume is not None:
        from ..errors import ConfigError

        bad = sorted(k for k, v in overrides.items() if v is not None and k not in RESUMABLE_OVERRIDES)
        if overwrite:
            raise ConfigError(f"resume= continues the comparison in {resume}; overwrite=True starts one again: pass one of them")
        if config is not None or variants is not DEFAULT_VARIANTS or bad:
            raise ConfigError(f"resuming {resume} takes the comparison's settings from its compare.json; only "
                              f"{', '.join(RESUMABLE_OVERRIDES)} may be passed" + (f" (got {', '.join(bad)})" if bad else ""))
        root: Path | None = Path(resume)
    else:
        root = Path(out) if out is not None else None
    with contextlib.ExitStack() as held:
        earlier = False
        if root is not None:
            if resume is None:
                rundir.check_writable(root, "out")
            held.enter_context(run_lock(root, "compare"))
            if resume is None:  # the CLI's rule: an earlier comparison only with overwrite=True
                earlier = rundir.check_comparison_dir(root, overwrite=overwrite, python=True)
        if resume is not None:
            saved, variants = load_plan(root)  # type: ignore[arg-type]
            base = resolve_config(saved, **{k: v for k, v in overrides.items() if k != "out"})
            _inputs_for_compare_resume(base, user, data, root)  # type: ignore[arg-type]
        else:
            base = resolve_config(config, **overrides)
            if data is not None:
                check_data_fields(base, data)
                base = record_data(base, data)
            if user is not None:
                base = record_model(base, user)
        planned = plan_variants(base, variants, root, model=user)  # every typo is reported before anything trains
        if earlier:  # every variant is valid: now the earlier comparison goes
            rundir.clear_comparison(root)  # type: ignore[arg-type]
        if root is not None:
            save_plan(root, base, variants)
        return _compare(base, planned, root, progress=progress, on_round=on_round, resume=resume is not None,
                        user=user, user_data=data)


def _check_builds(cfg: ExperimentConfig, user: UserModel) -> None:
    """Build ``cfg``'s copy of the user's module once, as the run will (norm conversion, the
    method's checks, FN's wrapper), so that a variant it cannot serve fails before any trains."""
    from ..errors import ConfigError
    from ..models import get_model
    from ..models.user import using_model

    with using_model(user, cfg), torch.random.fork_rng(devices=[]):  # a factory's draws leave the caller's stream alone
        try:
            get_model(cfg.model, norm=cfg.norm, norm_args=cfg.norm_args, **cfg.model_args)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model '{cfg.model}' with norm '{cfg.norm}': {exc}") from None


def _inputs_for_compare_resume(base: ExperimentConfig, user: UserModel | None, data: FederatedData | None, root: Path) -> None:
    """A comparison of a user's model or data resumes only with them given again (checked
    against what it recorded), so that the variants still to run train what the others did."""
    from ..data.provenance import check_same_data, is_user_dataset
    from ..errors import ConfigError
    from ..models.user import is_user_model

    missing = [n for n, recorded, given in (("model", is_user_model(base.model), user), ("data", is_user_dataset(base.dataset), data))
               if recorded and given is None]
    if missing:
        raise ConfigError(f"cannot resume {root} from its compare.json: its {' and '.join(missing)} came from Python; resume "
                          f"from Python with the same {' and '.join(missing)}: fednorm.compare(resume='{root}', "
                          + ", ".join(f"{n}=..." for n in missing) + ")")
    if user is not None:
        if not is_user_model(base.model):
            raise ConfigError(f"cannot resume {root}: it compares model '{base.model}' built from its config; leave model out")
        user.check_same(base.model_args, str(root))
    if data is not None:
        if not is_user_dataset(base.dataset):
            raise ConfigError(f"cannot resume {root}: it compares dataset '{base.dataset}' built from its config; leave data out")
        check_same_data(base.dataset_args, data, str(root))


def _reload(cfg: ExperimentConfig) -> RunResult | None:
    """A variant that already finished ``cfg.rounds`` rounds in ``cfg.out`` with ``cfg``'s settings."""
    from ..engine.outputs import read_metrics, read_summary

    d = Path(cfg.out)  # type: ignore[arg-type]
    try:
        summary = read_summary(d)
        saved = load_config(d / "config.yaml")
    except (OSError, ValueError, FednormError):
        return None
    if summary.get("status") != "completed" or summary.get("rounds") != cfg.rounds:
        return None
    check_resumable(cfg, saved.model_dump(mode="json"), d)
    return RunResult(saved, read_metrics(d), summary, d, None, None)  # type: ignore[arg-type]


def _compare(base: ExperimentConfig, planned: list[tuple[str, ExperimentConfig]], root: Path | None, *,
             progress: bool | None, on_round: Callable[[Any, Simulation], None] | None, resume: bool,
             user: UserModel | None = None, user_data: FederatedData | None = None) -> CompareResult:
    results: dict[str, RunResult] = {}
    interrupted: str | None = None
    stop_signal: int | None = None
    data = None
    data_keys = DATA_OBJECT_FIELDS
    with StopRequest() as stop:  # a signal between two variants stops too
        for label, cfg in planned:
            if stop.signal is not None:
                stop_signal = stop.signal
                break
            kept = _reload(cfg) if resume else None
            if kept is not None:
                results[label] = kept
                continue
            same_data = all(getattr(cfg, k) == getattr(base, k) for k in data_keys)
            given = data if data is not None and same_data else None
            if user_data is not None:  # the user's data: every variant's (plan_variants let none change it)
                given = user_data
            if resume and any((Path(cfg.out) / n).exists() for n in ("checkpoint.pt", "checkpoint.prev.pt")):  # type: ignore[arg-type]
                keep = {k: getattr(cfg, k) for k in RESUMABLE_OVERRIDES if k != "out" and getattr(cfg, k) is not None}
                result = run(resume=cfg.out, model=user, data=given, progress=progress, on_round=on_round, **keep)
            else:
                result = run(cfg, model=user, data=given, write=root is not None, progress=progress, on_round=on_round,
                             overwrite=True)  # the comparison owns its variants' directories
            if same_data:
                data = result.simulation.data
            if result.summary.get("status") == "interrupted":
                interrupted, stop_signal = label, result.stop_signal or stop.signal
                break
            results[label] = result
    comparison = CompareResult(results, root, stop_signal=stop_signal, interrupted=interrupted,
                               not_run=[label for label, _ in planned if label not in results and label != interrupted])
    if root is not None:
        from ..plotting import plot_comparison

        root.mkdir(parents=True, exist_ok=True)
        (root / "results.md").write_text(comparison.markdown() + "\n")
        (root / "results.csv").write_text(comparison.csv())
        if results:
            plot_comparison(
                {label: r.history for label, r in results.items()},
                root / "accuracy.png",
                title=f"{base.dataset}, {base.partition}, {base.num_clients} clients",
            )
    return comparison
