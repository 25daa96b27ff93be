"""``fednorm report RUN_DIR... [--out DIR]``: one page after a sweep.

Collects any set of run directories (a ``fednorm compare`` folder, a ``run --seeds`` folder, a
``fednorm reproduce`` suite, single runs, or several of these) into ``report.md`` and a
self-contained ``report.html``: a mean ± std table per variant (runs that differ only in the seed
are one variant, :mod:`.collect`; a variant is labelled by the settings that differ between the
variants, and the settings every run shares are listed once), per-source accuracies under
feature shift, the accuracy curves with ±std bands, each distinct partition's label distribution
(from ``partition.json``, which runs record), and the list of run directories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .collect import Run, Variant, describe_variants, find_runs, group_runs
from .figures import curve_figures, diagnostics_figure, domain_figure, partition_figures
from .render import domain_table, html_page, markdown, results_table, runs_table, settings_table

__all__ = ["Report", "build_report", "describe_variants", "find_runs", "group_runs", "Run", "Variant"]


@dataclass
class Report:
    """What :func:`build_report` wrote."""

    out: Path
    markdown: Path
    html: Path
    variants: list[Variant]
    figures: list[Path]


def build_report(paths: Iterable[str | Path], out: str | Path, *, title: str = "fednorm report") -> Report:
    """Read every run directory under ``paths`` and write ``out/report.md``, ``out/report.html``
    and the figures (``out/*.png``)."""
    paths = [Path(p) for p in paths]
    out = Path(out)
    runs = find_runs(paths)
    variants = group_runs(runs)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("curves_*.png"), *out.glob("partition_*.png"), out / "domains.png", out / "diagnostics.png"]:
        old.unlink(missing_ok=True)
    figures = curve_figures(variants, out)
    dom = domain_figure(variants, out)
    if dom is not None:
        figures.append(dom)
    diag = diagnostics_figure(variants, out)
    if diag is not None:
        figures.append(diag)
    figures += partition_figures(variants, out)
    settings = describe_variants([v.config for v in variants])
    tables = [results_table(variants)]
    for extra in (domain_table(variants), settings_table(variants, settings)):
        if extra is not None:
            tables.append(extra)
    tables.append(runs_table(variants))
    done = sum(len(v.completed) for v in variants)
    intro = (f"{len(runs)} run(s) ({done} completed) in {len(variants)} variant(s), from {', '.join(map(str, paths))}; "
             f"written {time.strftime('%Y-%m-%d %H:%M')}. Accuracies are mean ± sample std over each variant's completed "
             "runs (its seeds); 'per client' variants are evaluated with each client's own model.")
    md = out / "report.md"
    md.write_text(markdown(title, intro, tables, figures, out, settings.common))
    page = out / "report.html"
    page.write_text(html_page(title, intro, tables, figures, settings.common), encoding="utf-8")
    return Report(out, md, page, variants, [f.path for f in figures])
