"""The reproduction report's markdown: ``report.md`` from what :func:`fednorm.reproduce.report.collect` read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

__all__ = ["markdown", "settings_markdown", "LAST_ROUNDS", "STAT_LABEL"]

MAX_FLIPS = 6  # reversed pairs listed per column in report.md (all are in results.json)
from ..engine.last_rounds import LAST_ROUNDS  # "last-10": the mean over the last 10 rounds of a run
STAT_LABEL = {"final": "final", "best": "best", "last10": "last-10 mean", "best_val": "at best validation"}
PAPER_STAT_LABEL = {"final": "final", "best": "best", "best_val": "test accuracy at the best mean validation accuracy",
                    "best_val_client": "each client's test accuracy at its own best validation accuracy"}
METRIC_LABEL = {"test_accuracy": "test accuracy of the global model",
                "mean_client_accuracy": "mean over clients of the accuracy on each client's own test split"}


def _pct(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _ms(s: Mapping[str, Any] | None) -> str:
    if s and s.get("na"):
        return "n/a"
    if not s or s.get("mean") is None:
        return "—"
    return f"{s['mean']:.2f}" + ("" if s.get("std") is None else f" ± {s['std']:.2f}")


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}"


def _rounds_text(cell: Mapping[str, Any]) -> str:
    rounds = cell.get("rounds") or []
    if not rounds:
        return "—"
    paper = cell.get("paper_rounds")
    r = "/".join(str(x) for x in rounds)
    return f"{r} of {paper}" if paper and rounds != [paper] else r


def _setting_text(setting: Mapping[str, Any]) -> str:
    from ..config import ExperimentConfig

    defaults = {k: (f.default if f.default_factory is None else f.default_factory()) for k, f in ExperimentConfig.model_fields.items()}
    keep = {k: v for k, v in setting.items() if v != defaults.get(k) or k in ("dataset", "partition", "model", "norm", "method", "rounds", "batch_size", "lr", "num_clients")}
    return ", ".join(f"`{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}`" for k, v in keep.items())


def _table_markdown(t: Mapping[str, Any], out: Path) -> list[str]:
    lines = [f"## {t['title']}", "", f"`{t['config_file']}` — source: {t['source']}", ""]
    if t["claim"]:
        lines += [f"**Paper's claim:** {t['claim']}", ""]
    ran = sorted({r for c in t["cells"] for r in c.get("rounds") or []})
    ours = ran or t["planned_rounds"]
    paper_r = "/".join(map(str, t["paper_rounds"]))
    fraction = ""
    if len(t["paper_rounds"]) == 1 and len(ours) == 1 and t["paper_rounds"][0]:
        fraction = f" ({100 * ours[0] / t['paper_rounds'][0]:.3g}% of the paper's)"
    what = "Rounds run" if ran else "Rounds planned"
    lines += [f"**Scale:** {t['scale_description']} {what}: {'/'.join(map(str, ours))} of the paper's {paper_r}{fraction}.", ""]
    if t.get("data_subset"):
        ds = t["data_subset"]
        lines += [f"**Data subset:** {ds['train_per_class']} training and {ds['test_per_class']} test images per class "
                  f"(seed {ds['seed']}).", ""]
    lines += [f"**Setting shared by every cell:** {_setting_text(t['setting'])}", ""]
    if t.get("data_missing"):
        lines += [f"**Not run, data missing:** {t['data_missing']}", ""]
    metrics = sorted({c["metric"] for c in t["columns"]})
    descs = [METRIC_LABEL.get(m, m) for m in metrics if not m.startswith("client:")]
    if any(m.startswith("client:") for m in metrics):
        descs.insert(0, "per data-source columns: the accuracy of the client holding that source on its own test split")
    if any(m.startswith("unseen:") for m in metrics):
        descs = [d for d in descs if not d.startswith("unseen:")]
        descs.insert(0, "unseen-client columns: after the last round, the test accuracy on a dataset no client trained on, "
                        "with the clients' averaged weights and BN statistics computed on its own training images (FedBN App. G)")
    mdesc = "; ".join(descs)
    val_text = ("best-val: at the round of the best mean validation accuracy (each client's validation split, held out "
                "of its training data), n/a for a run without one. " if "best_val" in t["compare"] else "")
    lines += [f"**Metric:** {mdesc}, in %. Ours: mean ± sample std over the completed seeds; last-10: the mean over "
              f"the last {LAST_ROUNDS} rounds (R−{LAST_ROUNDS - 1} to R), n/a where a run did not evaluate each of them. "
              + val_text +
              f"The paper's number is compared with our {', '.join(STAT_LABEL[s] for s in t['compare'])} (difference = "
              f"ours − paper); the ordering uses the {STAT_LABEL[t['compare'][0]]}.", ""]
    with_val = "best_val" in t["compare"]  # a column of its own only where a table compares it
    head = "| method | column | final | best | last-10 | " + ("best-val | " if with_val else "") + "paper | " + " | ".join(f"Δ {STAT_LABEL[s]}" for s in t["compare"]) + " | seeds | rounds | wall (s) | status |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    has_sync = any("final_sync" in c["stats"] for c in t["cells"])
    for c in t["cells"]:
        status = c["status"] if not c.get("reason") else f"{c['status']}: {c['reason']}"
        if c.get("note"):
            status += f" (paper: {c['note']})"
        st = c["stats"]
        diffs = " | ".join(_signed(c["diff"].get(s)) for s in t["compare"])
        lines.append(
            f"| {c['row_label']} | {c['column_label']} | {_ms(st.get('final'))} | {_ms(st.get('best'))} | {_ms(st.get('last10'))} | "
            + (f"{_ms(st.get('best_val'))} | " if with_val else "") + f"{c['paper_display']} | {diffs} | {(st.get('final') or {}).get('n', 0) or '—'} | {_rounds_text(c)} | "
            f"{_pct(c.get('wall_seconds') or None, 1)} | {status.replace('|', '/')} |"
        )
    stuck = [c for c in t["cells"] if c.get("stuck")]
    if stuck:
        lines += ["", "**Runs stuck at one class** (at least 99% of the test predictions in one class at the final "
                  "evaluation; a two-way outcome, so these cells' mean ± std above mixes two populations): " + "; ".join(
                      f"{c['row_label']} | {c['column_label']}: {c['stuck']['final']} of {c['stuck']['n']} seeds "
                      f"({', '.join(map(str, c['stuck']['seeds']))}); the {c['stuck']['n'] - c['stuck']['final']} that "
                      f"trained: final {_ms(c['stuck']['trained']['final'])}, best {_ms(c['stuck']['trained']['best'])}, "
                      f"last-10 {_ms(c['stuck']['trained']['last10'])}" for c in stuck) + "."]
    mixed = [(c, r) for c in t["cells"] for r in c["runs"]
             if len(r.get("commits") or []) > 1 or any("+dirty" in v for v in r.get("commits") or [])]
    if mixed:
        lines += ["", "**Runs not from one clean commit** (trained across code versions or from an uncommitted tree; "
                  "the code computes the same training, but a float32 run continued elsewhere is another draw: a rerun "
                  "from one clean commit replaces it): " + "; ".join(
                      f"{c['row_label']} | {c['column_label']} seed {r['seed']} ({', '.join(r['commits'])})" for c, r in mixed)
                  + "."]
    if has_sync:
        lines += ["", "HBN's statistics-only round T+1 (`final_sync`), mean ± std: " + "; ".join(
            f"{c['row_label']} | {c['column_label']}: {_ms(c['stats']['final_sync'])}" for c in t["cells"] if "final_sync" in c["stats"])]
    extra = sorted({k for c in t["cells"] for k in c["stats"] if k.startswith("test:")})
    for key in extra:  # the final checkpoints scored on another test set (fednorm evaluate)
        lines += ["", f"Final accuracy on `{key[5:]}` (`fednorm evaluate`; the runs' own test set is in the table above), "
                  "mean ± std over the seeds scored: " + "; ".join(
                      f"{c['row_label']} | {c['column_label']}: {_ms(c['stats'][key])}" for c in t["cells"] if key in c["stats"])]
    na = sorted({c["stats"]["last10"]["na"] for c in t["cells"] if (c["stats"].get("last10") or {}).get("na")})
    if na:
        planned = t["setting"].get("eval_last_rounds") or 0
        lines += ["", f"last-10 is n/a where the runs were {'; '.join(na)} (their config.yaml): they hold no evaluation of "
                  f"some of their last {LAST_ROUNDS} rounds."
                  + (f" Runs started from this table's config evaluate each of their last {planned} rounds too."
                     if planned >= LAST_ROUNDS else "")]
    lines += _paper_statistic_markdown(t)
    lines += ["", f"**Ordering of the methods within each column** (by the {STAT_LABEL[t['compare'][0]]}; pairs of rows with a paper number):", ""]
    labels = {r["id"]: r["label"] for r in t["rows"]}
    for col in t["columns"]:
        o = t["ordering"][col["id"]]
        if o["holds"] is None:
            lines.append(f"- {col['label']}: not enough results to compare ({len(o['rows'])} row(s) with a paper number and a result)")
        elif o["holds"]:
            lines.append(f"- {col['label']}: **holds** ({o['agree']} of {o['pairs']} pairs; paper order {' > '.join(labels[r] for r in o['rows'])})")
        else:
            flips = "; ".join(f"{labels[f['paper_higher']]} {f['ours'][0]:.2f} ≤ {labels[f['paper_lower']]} {f['ours'][1]:.2f} "
                              f"(paper {f['paper'][0]:.2f} > {f['paper'][1]:.2f})" for f in o["flips"][:MAX_FLIPS])
            if len(o["flips"]) > MAX_FLIPS:
                flips += f"; and {len(o['flips']) - MAX_FLIPS} more (results.json)"
            lines.append(f"- {col['label']}: **does not hold** ({o['agree']} of {o['pairs']} pairs agree); reversed: {flips}")
    tests = [(col, x) for col in t["columns"] for x in t["ordering"][col["id"]].get("tests", [])]
    if tests:
        lines += ["", f"**Differences over seeds** (the {STAT_LABEL[t['compare'][0]]}; ours, the row the paper ranks "
                  "higher minus the lower; 95% interval over the completed seeds, paired by seed where both rows ran "
                  "at least two common seeds (a seed's rows share its partition and client sampling), Welch's "
                  "otherwise; pairs with at least two seeds on each side):", "",
                  "| column | paper: higher > lower | ours: difference (95% interval) | seeds | test | verdict |",
                  "|---|---|---:|---|---|---|"]
        for col, x in tests:
            verdict = {"ahead": "the paper's order, beyond the seeds' spread",
                       "behind": "the reverse order, beyond the seeds' spread",
                       "not distinguishable": (f"not distinguishable at {x['n'][0]} paired seeds" if x.get("test") == "paired"
                                               else f"not distinguishable at {x['n'][0]} and {x['n'][1]} seeds")}[x["verdict"]]
            lines.append(f"| {col['label']} | {labels[x['paper_higher']]} > {labels[x['paper_lower']]} | "
                         f"{x['diff']:+.2f} ({x['low']:+.2f} to {x['high']:+.2f}) | {x['n'][0]} / {x['n'][1]} | "
                         f"{x.get('test', 'welch')} | {verdict} |")
    if t["notes"]:
        lines += ["", "**Notes:**", ""] + [f"- {n}" for n in t["notes"]]
    if t.get("settings"):
        lines += ["", f"Settings where these runs differ from the paper or the paper from its code: {len(t['settings'])}, "
                  "in the table at the top of this report."]
    plots = [p for p in (f"plots/{t['table']}_curves.png", f"plots/{t['table']}_bars.png") if (out / p).is_file()]
    if plots:
        lines += [""] + [f"![{Path(p).stem}]({p})" for p in plots]
    runs = [(c, r) for c in t["cells"] for r in c["runs"]]
    seen: set[str] = set()
    if runs:
        lines += ["", "<details><summary>Runs</summary>", "", "| run directory | seed | status | rounds | wall (s) | engine wall (s) | commit | command |",
                  "|---|---|---|---|---|---|---|---|"]
        for c, r in runs:
            if r["dir"] in seen:
                continue
            seen.add(r["dir"])
            rel = Path(r["dir"]).relative_to(out) if Path(r["dir"]).is_relative_to(out) else r["dir"]
            commit = ", ".join(r.get("commits") or []) or "—"
            resumed = r.get("mean_momentum_resumes") or []
            status = r["status"] + (f" (resumed at round {', '.join(map(str, resumed))} from the clients' mean momentum)"
                                    if resumed else "")
            lines.append(f"| `{rel}` | {r['seed']} | {status} | {r['rounds']} | {_pct(r['wall_seconds'], 1)} | "
                         f"{_pct(r['engine_wall_seconds'], 1)} | {commit} | `{r.get('command') or '—'}` |")
        lines += ["", "</details>"]
    return lines + [""]


def _kind_label(kind: str, stat: Mapping[str, Any]) -> str:
    if kind == "last_mean":
        return f"mean of the last {stat.get('evaluations')} evaluations"
    return PAPER_STAT_LABEL[kind]


def _paper_statistic_markdown(t: Mapping[str, Any]) -> list[str]:
    """The paper's statistic in words, and ours computed the same way beside our final, for
    every cell with a paper number and a finished run."""
    stat = t.get("paper_statistic")
    if not stat:
        return []
    lines = ["", f"**The paper's statistic:** {stat['words']} (source: {stat['source']})."
             + (f" {stat['note']}" if stat.get("note") else "")]
    cells = [c for c in t["cells"] if c.get("paper") is not None and c.get("paper_statistic")]
    if not cells:
        return lines + ["", "Ours computed the same way: no finished run of a cell with a paper number yet."]
    notes = {}
    for c in cells:
        own = [w for p in c["paper_statistic"] for w in p["why"]]
        rounds, paper_rounds = c.get("rounds") or [], c.get("paper_rounds")
        if rounds and paper_rounds and rounds != [paper_rounds]:
            own.append(f"after {'/'.join(map(str, rounds))} of the paper's {paper_rounds} rounds")
        notes[(c["row"], c["column"])] = list(dict.fromkeys(own))
    shared = [w for w in next(iter(notes.values())) if all(w in v for v in notes.values())]
    lines += ["", "Ours computed the same way from each finished run (mean ± std over the seeds; Δ = ours − paper), "
              "beside our final" + (f". For every cell below: {'; '.join(shared)}." if shared else "."), "",
              "| method | column | paper | the paper's statistic | ours, the same way (Δ) | our final (Δ) | seeds "
              f"{'(the paper: runs) ' if stat.get('runs') else ''}| note |",
              "|---|---|---|---|---|---|---|---|"]
    runs = f" ({stat['runs']})" if stat.get("runs") else ""
    for c in cells:
        kinds = " / ".join(_kind_label(p["kind"], stat) for p in c["paper_statistic"])
        ours = " / ".join("n/a" if p["mean"] is None else f"{_ms(p)} ({_signed(p['diff'])})" for p in c["paper_statistic"])
        final = c["stats"].get("final") or {}
        final_diff = None if final.get("mean") is None else final["mean"] - c["paper"]
        note = "; ".join(w for w in notes[(c["row"], c["column"])] if w not in shared) or ""
        lines.append(f"| {c['row_label']} | {c['column_label']} | {c['paper_display']} | {kinds} | {ours} | "
                     f"{_ms(final)} ({_signed(final_diff)}) | {final.get('n') or '—'}{runs} | {note.replace('|', '/')} |")
    return lines


def settings_markdown(results: Mapping[str, Any]) -> list[str]:
    """One table of every setting where the paper's runs differ from the paper or the paper from
    its code, over all of a paper's tables (an entry shared by several tables once): the form
    REPRODUCTION.md's section for the paper takes."""
    tables = [t for t in results["tables"] if t.get("settings")]
    if not tables:
        return []
    entries: dict[str, dict[str, Any]] = {}
    for t in tables:
        for entry in t["settings"]:
            key = json.dumps(entry, sort_keys=True)
            entries.setdefault(key, {**entry, "tables": []})["tables"].append(t["table"])
    several = len(tables) > 1
    options = any(e.get("option") for e in entries.values())
    head = (["setting", "paper", "released code", "ours", "effect"] + (["to run the paper's/code's choice"] if options else [])
            + (["tables"] if several else []) + ["source"])
    lines = ["## Settings where our runs differ from the paper, or the paper from its released code", "",
             "From the `settings:` of each table config (the spec note's section on where the paper and its code "
             "disagree is cited). Effects are measured only where the text says so.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries.values():
        row = [e["setting"], e["paper"], e["code"], e["ours"], e["effect"]] + ([e.get("option") or "—"] if options else [])
        row += ([", ".join(e["tables"]) if len(e["tables"]) < len(tables) else "all"] if several else []) + [e["source"]]
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in row) + " |")
    return lines + [""]


def markdown(results: Mapping[str, Any]) -> str:
    out = Path(results["out"])
    git = results.get("fednorm") or {}
    commit = "unknown" if not git.get("commit") else git["commit"] + (" (with uncommitted changes)" if git.get("dirty") else "")
    lines = [f"# Reproduction of the {results['paper']} paper's tables ({results['scale']} scale)", "",
             f"Generated {results['generated']} from the run directories under `{out}` by fednorm at commit {commit}. "
             f"Each run directory records the commit and command that produced it (see *Runs*).", ""]
    lines += settings_markdown(results)
    for t in results["tables"]:
        lines += _table_markdown(t, out)
    return "\n".join(lines)
