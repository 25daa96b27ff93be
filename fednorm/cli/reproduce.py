"""``fednorm reproduce <paper>``: rerun a paper's tables from the shipped configs and report.

    fednorm reproduce hbn --scale reduced                 # every HBN table, the stated reduced scale
    fednorm reproduce hbn --table table1 --rows bn,hbn --columns phi0.6 --seeds 3 --jobs 2
    fednorm reproduce fedtan --rounds 1000 --device cuda  # the first 1,000 of the paper's 10,000 rounds
    fednorm reproduce fbn --dry-run                       # what would run, what is cached or resumable
    fednorm reproduce fedbn --report-only                 # rebuild report.md from the run directories
    fednorm reproduce --list                              # papers and tables

The tables live in ``configs/reproduce/<paper>/<table>.yaml`` (setting, rows, columns, the reduced
scale and the paper's numbers); results go to ``--out`` (default ``reproduce/<paper>/<scale>``).
Running the same command again reruns nothing that finished and resumes what was interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError, DatasetError
from .errors import exit_code_for_signal

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "reproduce",
        help="rerun a paper's tables from the shipped configs; report ours beside the paper's numbers",
        description="Run the tables of a paper (configs/reproduce/<paper>/*.yaml) at full or reduced scale, one "
        "checkpointed run directory per cell and seed, and write report.md, results.json and plots. Finished runs are "
        "never rerun; interrupted ones resume from their checkpoint when the same command runs again.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paper", nargs="?", help="hbn, fedtan, fbn, ln or fedbn")
    p.add_argument("--table", action="append", metavar="T", help="a table of the paper (repeat or comma-separate; default: all)")
    p.add_argument("--scale", choices=("full", "reduced"), default="full", help="the paper's setting, or the table's stated reduced scale (default: full)")
    p.add_argument("--seeds", type=int, help="seeds per cell (default: the table's)")
    p.add_argument("--rows", help="only these rows (comma-separated ids; see --list)")
    p.add_argument("--columns", help="only these columns (comma-separated ids)")
    p.add_argument("--rounds", type=int, help="run this many rounds instead of the scale's (a stated fraction of the paper; "
                   "a later, larger value extends the finished runs)")
    p.add_argument("--out", type=Path, help="output folder (default: reproduce/<paper>/<scale>)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel, one process each (default: 1)")
    p.add_argument("--stack", choices=("auto", "cells", "off"), default="auto",
                   help="auto (default): a cell's seeds train together as one computation where the method allows "
                        "(equal to one by one to float rounding; much faster on a GPU); cells: also the runs of a "
                        "row's cells that differ only in partition or learning rate (a GPU trains many stacked rows "
                        "as fast as a few); off: one run at a time. With --jobs > 1 each process runs one run")
    p.add_argument("--threads", type=int, help="torch threads per run (default: 1 with --jobs > 1, else torch's choice)")
    p.add_argument("--device", help="torch device of every run, e.g. cuda (default: the config's, cpu)")
    p.add_argument("--data-dir", help="folder holding the datasets (default: $FEDNORM_DATA, else ../shared/data beside the "
                   "repository when present, else ~/.cache/fednorm)")
    p.add_argument("--download", action="store_true", help="download missing datasets (needs a network)")
    p.add_argument("--configs", type=Path, help="folder of the table configs (default: the repository's configs/reproduce)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the papers, their tables, rows and columns, and exit")
    what.add_argument("--coverage", action="store_true",
                      help="rewrite docs/reproduce.md's coverage table (every experiment of the five papers, from "
                      "configs/reproduce/inventory.yaml, the table configs and the records in reproduction/) and exit")
    p.add_argument("--allow-dirty", action="store_true", help="run even with uncommitted changes to fednorm/ or "
                   "configs/ (refused by default: a result must name the code that made it); the diff's hash is recorded")
    what.add_argument("--dry-run", action="store_true", help="show every planned run and whether it is done, resumable or new; run nothing")
    what.add_argument("--report-only", action="store_true", help="only rebuild report.md, results.json and the plots from the run directories")
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="then copy every run's records (config, evaluations, summary, invocations, curve) into DIR and "
                   "write the report there too: a folder to commit, e.g. reproduction/<paper>; a run further along in DIR "
                   "is left alone")
    p.add_argument("--export-checkpoints", action="store_true",
                   help="with --export: unfinished runs take their checkpoint along, so a later session resumes them "
                   "from a copy of DIR (--out COPY); finished runs take theirs when it is at most 5 MB, so that "
                   "`fednorm diagnose` works on the exported record. A DSGD checkpoint keeps only the clients' weighted mean "
                   "momentum where that continues the run (equal to float rounding; FBN: 58 MB -> 10.5 MB)")
    p.add_argument("--no-plots", action="store_true", help="write report.md and results.json without plots")
    p.add_argument("--quiet", action="store_true", help="no per-round progress bar (the per-run lines stay)")
    return p


def _split(values: Sequence[str] | str | None) -> list[str] | None:
    if not values:
        return None
    items = values if isinstance(values, (list, tuple)) else [values]
    out = [v.strip() for item in items for v in item.split(",") if v.strip()]
    return out or None


def _list(args: argparse.Namespace, root: Path | None) -> int:
    from ..reproduce.suite import PAPERS, list_tables, load_paper

    for paper in [args.paper] if args.paper else PAPERS:
        try:
            tables = load_paper(paper, _split(args.table), root)
        except ConfigError as exc:
            print(f"{paper}: {exc}")
            continue
        print(f"{paper}: {', '.join(list_tables(paper, root))}")
        for t in tables:
            skipped = [f"{r}/{c}" for (r, c), cell in t.cells.items() if cell.skip]
            print(f"  {t.id}: {t.title}")
            print(f"    rows: {', '.join(r.id for r in t.rows)}")
            print(f"    columns: {', '.join(c.id for c in t.columns)}")
            print(f"    cells: {len(t.rows) * len(t.columns) - len(skipped)} run" + (f", skipped: {', '.join(skipped)}" if skipped else "")
                  + f"; seeds: {t.seeds}; reduced: {t.reduced.get('description', '')}")
    return 0


def _coverage(root: Path | None) -> int:
    from ..reproduce.coverage import coverage_markdown, load_inventory, repository_root, update_section

    docs = repository_root() / "docs" / "reproduce.md"
    section = coverage_markdown(load_inventory(root=root))
    if not docs.is_file():
        print(section, end="")
        return 0
    text = docs.read_text(encoding="utf-8")
    new = update_section(text, section)
    if new != text:
        docs.write_text(new, encoding="utf-8")
    print(section.splitlines()[0])
    print(f"{docs}: coverage table {'rewritten' if new != text else 'already current'}")
    return 0


def _complete_scores(specs: list) -> None:
    """Finished runs that lack a score on the table's other test sets or unseen clients (their
    scoring failed, or the test file arrived later) are scored now, before the table goes on."""
    from ..reproduce import runner

    for spec in specs:
        if not runner.missing_scores(spec):
            continue
        scored, failed = runner.complete_scores(spec)
        if scored:
            print(f"{spec.describe()}: scored on {', '.join(scored)}  {spec.dir}", flush=True)
        for failure in failed:
            print(f"fednorm reproduce: warning: {spec.describe()}: not scored on {failure}", file=sys.stderr, flush=True)


def _fmt(v: Any) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def command(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    from ..reproduce import report as report_mod
    from ..reproduce import runner, schedule
    from ..reproduce.suite import PAPERS, load_paper

    root = args.configs
    if args.list:
        return _list(args, root)
    if args.coverage:
        return _coverage(root)
    if not args.paper:
        raise ConfigError(f"name a paper: one of {', '.join(PAPERS)} (or --list)")
    if args.export_checkpoints and not args.export:
        raise ConfigError("--export-checkpoints needs --export DIR")
    for name in ("jobs", "seeds", "rounds", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}")
    tables = load_paper(args.paper, _split(args.table), root)
    rows, columns = _split(args.rows), _split(args.columns)
    runner.check_selection(tables, rows, columns)
    out = (args.out or Path("reproduce") / args.paper / args.scale).resolve()
    data_dir = runner.default_data_dir(args.data_dir)
    threads = args.threads if args.threads is not None else (1 if args.jobs > 1 else None)
    overrides = {"rounds": args.rounds, "device": args.device, "threads": threads, "download": True if args.download else None}
    report_overrides = {"rounds": args.rounds}

    def write_report() -> None:
        for folder in [out] + ([args.export.resolve()] if args.export else []):
            if folder != out:
                from ..reproduce.export import export_runs

                done = export_runs(out, folder, checkpoints=args.export_checkpoints)
                print(f"exported {len(done.copied)} run(s) to {folder}"
                      + (f", {len(done.checkpoints)} with their checkpoint" if done.checkpoints else "")
                      + (f" ({len(done.compacted)} of DSGD with the clients' mean momentum only)" if done.compacted else "")
                      + (f"; left alone {len(done.kept)} further along there" if done.kept else ""))
            results = report_mod.collect(load_paper(args.paper, None, root), scale=args.scale, out=folder, data_dir=data_dir,
                                         overrides=report_overrides)
            paths = report_mod.write_report(results, plots=not args.no_plots)
            print(f"report: {paths['report']}  results: {paths['results']}" + ("" if args.no_plots else f"  plots: {folder / 'plots'}"))

    if args.report_only:
        write_report()
        return 0
    specs = runner.plan(tables, scale=args.scale, out=out, seeds=args.seeds, rows=rows, columns=columns,
                        data_dir=data_dir, overrides=overrides)
    work = runner.states(specs)
    todo = [(s, st) for s, st in work if st.action in ("new", "resume", "extend")]
    counts: dict[str, int] = {}
    for _, st in work:
        counts[st.action] = counts.get(st.action, 0) + 1
    summary = ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
    print(f"{args.paper} ({args.scale} scale): {len(specs)} runs in {len(tables)} table(s): {summary} -> {out}", flush=True)
    if args.dry_run:
        for spec, st in work:
            extra = f" ({st.detail})" if st.detail else ""
            print(f"  {st.action:8s} {spec.describe()}: {spec.config['rounds']} rounds{extra}  {spec.dir}")
        return 0

    git = runner.git_info()
    runner.refuse_uncommitted(git, args.allow_dirty)  # before any run starts or resumes (issue 37.6)
    cmd = shlex.join(["fednorm", *(argv if argv is not None else sys.argv[1:])])
    by_table: dict[str, list] = {}
    for spec, st in todo:
        by_table.setdefault(spec.table, []).append((spec, st))
    selected = _split(args.table) is not None
    ready: list = []
    unavailable = []
    for t in tables:
        if t.id not in by_table:
            continue
        try:
            runner.prepare_data(t, [s for s, _ in by_table[t.id]], source_dir=data_dir, out=out, download=args.download)
        except DatasetError as exc:
            if selected:
                raise
            unavailable.append(t.id)
            print(f"skipping {t.paper}/{t.id}: {exc}", file=sys.stderr, flush=True)
            continue
        ready += by_table[t.id]
    total, done, killed = len(ready), [0], []

    def on_done(spec: runner.RunSpec, outcome: runner.Outcome) -> None:
        done[0] += 1
        if outcome.status == "running elsewhere":
            print(f"[{done[0]}/{total}] {spec.describe()}: skipped, another process is running it ({outcome.error})  {spec.dir}", flush=True)
            return
        if outcome.status == "killed":
            killed.append(spec)
            print(f"[{done[0]}/{total}] {spec.describe()}: killed after {outcome.wall_seconds:.1f} s: {outcome.error}  {spec.dir}",
                  file=sys.stderr, flush=True)
            return
        s = outcome.summary or {}
        # last-10 as the report and summary.json have it: rounds R-9 to R, n/a unless each was evaluated (issue 50)
        last10 = report_mod.run_metrics(spec.dir, "test_accuracy").get("last10")
        acc = (f"final {_fmt(s.get('final_test_accuracy'))}, best {_fmt(s.get('best_test_accuracy'))}, "
               f"last-10 {'n/a' if last10 is None else f'{last10:.2f}%'}")
        if s.get("final_mean_client_accuracy") is not None:
            acc += f", mean client {_fmt(s.get('final_mean_client_accuracy'))}"
        verb = {"resume": "resumed", "extend": "extended"}.get(outcome.action, "ran")
        print(f"[{done[0]}/{total}] {spec.describe()}: {verb}, {outcome.status} after {outcome.rounds} rounds, {acc} "
              f"({outcome.wall_seconds:.1f} s)  {spec.dir}", flush=True)
        for failure in outcome.extra.get("scoring_errors", []):
            print(f"fednorm reproduce: warning: {spec.describe()}: not scored on {failure}; the next run of this command "
                  "tries again", file=sys.stderr, flush=True)

    def on_group(specs: list, blockers: list[str]) -> None:
        first = specs[0]
        if len({(s.table, s.label) for s in specs}) > 1:  # --stack cells: several cells in one group
            what = "; ".join(f"{s.table} {s.label} seed {s.seed}" for s in specs)
        else:
            what = f"{first.table} {first.label}: seeds " + ", ".join(str(s.seed) for s in specs)
        if blockers:
            print(f"{what} run one by one ({'; '.join(blockers)})", flush=True)
        else:
            print(f"{what} stacked into one computation", flush=True)

    _complete_scores([s for s, st in work if st.action == "done"])
    try:
        schedule.run_all(ready, jobs=args.jobs, command=cmd, git=git, on_done=on_done, on_group=on_group,
                       stack=args.stack != "off" and args.jobs <= 1, stack_cells=args.stack == "cells",
                       progress=False if (args.quiet or args.jobs > 1) else None)
    except schedule.SuiteInterrupted as exc:
        print("fednorm reproduce: interrupted; every started run has a checkpoint. Run the same command again to resume.",
              file=sys.stderr)
        write_report()
        return exit_code_for_signal(exc.signum)
    write_report()
    if killed:
        print(f"fednorm reproduce: {len(killed)} run(s) killed (see above); run the same command again to resume them.",
              file=sys.stderr)
        return 1
    if unavailable:
        print(f"not run for missing data: {', '.join(unavailable)} (see the messages above)", file=sys.stderr)
        if len(unavailable) == len(by_table):  # nothing asked for could run
            return 1
    return 0
