"""``report.md`` and a self-contained ``report.html`` (figures inlined as base64 PNG, no scripts,
nothing fetched) from the same tables.

The page stays within its width at any window size: tables sit in a container as wide as the
text, long cells (labels, directories) wrap anywhere, and only a table whose numbers alone are
wider than the window scrolls, inside its container, never the page."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Sequence

from .collect import Settings, Variant
from .figures import Figure

__all__ = ["Table", "results_table", "domain_table", "runs_table", "settings_table", "markdown", "html_page"]

COLUMNS = (("final_test_accuracy", "final acc (%)"), ("best_test_accuracy", "best acc (%)"),
           ("last10_mean_test_accuracy", "last-10 rounds acc (%)"), ("final_mean_client_accuracy", "mean client acc (%)"))


class Table:
    """A table: a title, a header row, body rows of strings, which columns are numbers, which
    hold long text (``{column: "label" | "path" | "text"}``, wrapped anywhere in the page) and a
    note printed under the title."""

    def __init__(self, title: str, header: Sequence[str], rows: list[list[str]], numeric: Sequence[int] = (), id: str = "",
                 text: dict[int, str] | None = None, note: str = "") -> None:
        self.title, self.header, self.rows, self.numeric, self.id = title, list(header), rows, set(numeric), id
        self.text, self.note = {0: "label"} if text is None else text, note


def _pm(st: object | None, scale: float = 100.0) -> str:
    """``mean ± std``, or the one value of a single run (a std of one run says nothing)."""
    if st is None:
        return "n/a"
    if len(st.values) < 2:  # type: ignore[attr-defined]
        return f"{scale * st.mean:.2f}"  # type: ignore[attr-defined]
    return f"{scale * st.mean:.2f} ± {scale * st.std:.2f}"  # type: ignore[attr-defined]


def results_table(variants: list[Variant]) -> Table:
    """Per variant: runs, mean ± std of the final, best, last-10 and mean per-client accuracy,
    rounds and mean wall time."""
    rows = []
    for v in variants:
        done = v.completed
        rounds = sorted({r.summary.get("rounds") for r in done})
        walls = [r.summary.get("wall_seconds") for r in done if isinstance(r.summary.get("wall_seconds"), (int, float))]
        rows.append([v.label, "per client" if v.personalized else "global", f"{len(done)}/{len(v.runs)}",
                     *[_pm(v.stats.get(name)) for name, _ in COLUMNS],
                     "/".join(map(str, rounds)) or "n/a", f"{sum(walls) / len(walls):.1f}" if walls else "n/a"])
    header = ["variant", "evaluated", "runs", *[h for _, h in COLUMNS], "rounds", "wall (s)"]
    from ..engine.last_rounds import last10_note

    note = last10_note((r.summary, r.config) for v in variants for r in v.completed)  # why a last-10 cell is n/a
    return Table("Results", header, rows, numeric=range(2, len(header)), id="results", note=note)


def domain_table(variants: list[Variant]) -> Table | None:
    """Final accuracy per data source (mean over the source's clients), mean ± std, of each variant that has any."""
    sources = sorted({k[len("final_accuracy["):-1] for v in variants for k in v.stats if k.startswith("final_accuracy[")})
    if not sources:
        return None
    rows = [[v.label, *[_pm(v.stats.get(f"final_accuracy[{s}]")) for s in sources]] for v in variants
            if any(f"final_accuracy[{s}]" in v.stats for s in sources)]  # a row of n/a only would bury the others
    return Table("Final accuracy per data source (%)", ["variant", *sources], rows, numeric=range(1, len(sources) + 1), id="domains")


def runs_table(variants: list[Variant]) -> Table:
    """Every run directory: its variant, seed, status and final accuracy."""
    rows = []
    for v in variants:
        for r in v.runs:
            acc = r.summary.get("final_test_accuracy")
            rows.append([v.label, str(r.config.get("seed")), str(r.summary.get("status")),
                         "n/a" if acc is None else f"{100 * acc:.2f}", str(r.dir)])
    return Table("Run directories", ["variant", "seed", "status", "final acc (%)", "directory"], rows, numeric=(1, 3), id="runs",
                 text={0: "label", 4: "path"})


def _pairs(settings: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def settings_table(variants: list[Variant], settings: Settings) -> Table | None:
    """Per variant, the settings its label leaves out or shortens (``None`` when every label
    names all of its variant's differing settings): every setting off its usual value, in full."""
    if settings.complete:
        return None
    rows = [[v.label, _pairs({k: x for k, x in v.settings.items() if k not in ("method", "norm") and settings.usual.get(k) != x})
             or "(every setting at its usual value)"] for v in variants]
    note = ("The labels name only some of the settings that differ between variants. A variant has the usual value of a "
            f"setting unless its row says otherwise; the usual values: {_pairs(settings.usual)}.") if settings.usual else \
        "The labels are shortened; each variant's settings that differ between variants, in full:"
    return Table("Variant settings", ["variant", "settings that differ from the usual"], rows, id="settings",
                 text={0: "label", 1: "text"}, note=note)


def _md_table(t: Table) -> str:
    align = ["---:" if i in t.numeric else "---" for i in range(len(t.header))]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = [f"## {t.title}", "", *([t.note, ""] if t.note else []), "| " + " | ".join(t.header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


COMMON_NOTE = "Every run in this report has these settings (a variant's label names only what differs):"


def markdown(title: str, intro: str, tables: list[Table], figures: list[Figure], out: Path,
             common: dict[str, str] | None = None) -> str:
    """``report.md``: the tables, the settings every run shares, then the figures (files beside it)."""
    parts = [f"# {title}", "", intro, ""]
    main = [t for t in tables if t.id != "runs"]
    for t in main:
        parts += [_md_table(t), ""]
    if common:
        parts += ["## Common settings", "", COMMON_NOTE, "", " · ".join(f"`{k}={v}`" for k, v in common.items()), ""]
    if figures:
        parts += ["## Figures", ""]
        for f in figures:
            parts += [f"![{f.caption}]({f.path.relative_to(out).as_posix()})", "", f"*{f.caption}*", ""]
    for t in tables:
        if t.id == "runs":
            parts += [_md_table(t), ""]
    return "\n".join(parts)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem;
       color: #222; overflow-wrap: anywhere; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.table-wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3rem 0.6rem; vertical-align: top; }
th { background: #f4f4f4; text-align: left; overflow-wrap: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
td.label { min-width: 10rem; } td.text { min-width: 16rem; font-size: 0.85rem; }
td.path { font-family: ui-monospace, monospace; font-size: 0.75rem; }
ul.settings { columns: 17rem; column-gap: 2rem; padding-left: 1.2rem; font-size: 0.85rem; }
ul.settings li { break-inside: avoid; }
figure { margin: 1rem 0 2rem; } figure img { max-width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; max-width: 60rem; }
.small { font-size: 0.8rem; color: #666; }
"""


def _html_cell(t: Table, i: int, c: str) -> str:
    e = html.escape
    if i in t.numeric:  # "mean ±&nbsp;std" may break before the ± in a narrow window, never inside a number
        return f'<td class="num">{e(c).replace(" ± ", " ±&nbsp;")}</td>'
    return f'<td class="{t.text[i]}">{e(c)}</td>' if i in t.text else f"<td>{e(c)}</td>"


def _html_table(t: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in t.header)
    body = []
    for row in t.rows:
        cells = "".join(_html_cell(t, i, c) for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    ident = f' id="{e(t.id)}"' if t.id else ""
    note = f"<p>{e(t.note)}</p>\n" if t.note else ""
    return (f"<h2>{e(t.title)}</h2>\n{note}<div class=\"table-wrap\"><table{ident}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
            + "\n".join(body) + "\n</tbody>\n</table></div>")


def html_page(title: str, intro: str, tables: list[Table], figures: list[Figure], common: dict[str, str] | None = None) -> str:
    """``report.html``: one file, the figures inlined, no scripts and nothing fetched."""
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{e(title)}</title>",
             f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{e(title)}</h1>", f"<p>{e(intro)}</p>"]
    for t in tables:
        if t.id != "runs":
            parts.append(_html_table(t))
    if common:
        items = "".join(f"<li><code>{e(k)}={e(v)}</code></li>" for k, v in common.items())
        parts.append(f'<h2>Common settings</h2>\n<p>{e(COMMON_NOTE)}</p>\n<ul class="settings" id="common">{items}</ul>')
    if figures:
        parts.append("<h2>Figures</h2>")
        for f in figures:
            data = base64.b64encode(f.path.read_bytes()).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(f.caption)}">'
                         f"<figcaption>{e(f.caption)}</figcaption></figure>")
    for t in tables:
        if t.id == "runs":
            parts.append(f'<div class="small">{_html_table(t)}</div>')
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)
