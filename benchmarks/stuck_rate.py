"""FedAvg+BN's stuck start as a rate: how many runs still predict one class at rounds 20, 40, 100.

At HBN Table 1's setting (CIFAR-10, Simple-CNN, B = 4, 100 clients Dir(0.6), 10 per round) some
FedAvg+BN runs never leave predicting a single class. This script counts them, for fednorm's runs
(the run directories of ``fednorm reproduce``: each evaluation records ``top_class_share``) and for
the independent reference loop (``benchmarks/hbn_reference_loop.py``'s JSONL), and tests whether
the two rates differ with Fisher's exact test (written out below: a 2×2 table's hypergeometric
tail, no SciPy needed).

A run is *stuck* at round r when at least 99% of its test predictions fall in one class
(``top_class_share >= 0.99``), the reference loop's definition. fednorm records without
``top_class_share`` (written before it existed) fall back to an accuracy of exactly 10.00% on the
balanced test set, and the output says so.

*Still* stuck at round r means stuck at every evaluation up to r, which is what the rate counts.
That lets a long horizon be measured by continuing only the runs still stuck at a shorter one:
``--reference A.jsonl,B.jsonl`` and ``--fednorm LABEL=DIR1,DIR2`` merge their runs seed by seed
(a later source's evaluations extend or replace an earlier one's). A run that left one class
before its records end is not stuck at any later round, so it counts at r without having
been continued; the output's ``carried`` says how many runs were counted that way.

    python benchmarks/stuck_rate.py --reference /work/stuck/reference_bn_phi0.6_r40.jsonl \
        --fednorm BN=/work/stuck/fednorm_bn_phi0.6_r40/table1/bn__phi0.6 --rounds 20,40 \
        --out reproduction/hbn/stuck_rate/bn_phi0.6_r40.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

STUCK_SHARE = 0.99


def fisher_exact(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """Fisher's exact test of the 2×2 table [[a, b], [c, d]] (rows: the two loops; columns:
    stuck, not stuck). Returns (two-sided p, one-sided p that the first row's stuck rate is
    higher). Two-sided: the sum of the probabilities of every table with the same margins that is
    no more likely than the observed one (R's and SciPy's convention)."""
    row1, row2, col1 = a + b, c + d, a + c
    n = row1 + row2

    def prob(x: int) -> float:
        return math.comb(row1, x) * math.comb(row2, col1 - x) / math.comb(n, col1)

    lo, hi = max(0, col1 - row2), min(row1, col1)
    observed = prob(a)
    probs = {x: prob(x) for x in range(lo, hi + 1)}
    two = sum(p for p in probs.values() if p <= observed * (1 + 1e-7))
    greater = sum(p for x, p in probs.items() if x >= a)
    return min(1.0, two), min(1.0, greater)


def reference_runs(path: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """seed -> round -> that evaluation's record, from the reference loop's JSONL."""
    runs: dict[int, dict[int, dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        runs[int(rec["seed"])] = {int(e["round"]): {"stuck": bool(e["stuck"]), "accuracy": float(e["test_acc"]) / 100,
                                                    "top_class_share": float(e["top_class_share"])} for e in rec["evals"]}
    return runs


def merge(sources: list[dict[int, dict[int, dict[str, Any]]]]) -> dict[int, dict[int, dict[str, Any]]]:
    """The runs of several sources, seed by seed: a later source's evaluations extend (or, at the
    same round, replace) an earlier one's, as a run continued to a longer horizon does."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for runs in sources:
        for seed, evals in runs.items():
            out.setdefault(seed, {}).update(evals)
    return out


def fednorm_runs(cell: Path) -> tuple[dict[int, dict[int, dict[str, Any]]], bool]:
    """seed -> round -> record from a table cell's ``seed<k>/metrics.jsonl``, and whether any
    record lacked ``top_class_share`` (stuck then read as an accuracy of exactly 10.00%)."""
    runs: dict[int, dict[int, dict[str, Any]]] = {}
    fallback = False
    for d in sorted(cell.glob("seed*")):
        metrics = d / "metrics.jsonl"
        if not metrics.is_file():
            continue
        per_round = {}
        for line in metrics.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            share = rec.get("top_class_share")
            if share is None:
                fallback = True
                stuck = abs(rec["test_accuracy"] - 0.1) < 5e-5
            else:
                stuck = share >= STUCK_SHARE
            per_round[int(rec["round"])] = {"stuck": stuck, "accuracy": float(rec["test_accuracy"]), "top_class_share": share}
        if per_round:
            runs[int(d.name[4:])] = per_round
    return runs, fallback


def still_stuck(evals: dict[int, dict[str, Any]], r: int) -> bool | None:
    """Whether a run is stuck at every evaluation up to round ``r``; None when that is unknown
    (its records end before ``r`` while it was still stuck, or it has none up to ``r``)."""
    upto = [evals[k] for k in sorted(evals) if k <= r]
    if not upto:
        return None
    if not all(e["stuck"] for e in upto):
        return False  # it left one class by round r
    return True if r in evals else None


def rate(runs: dict[int, dict[int, dict[str, Any]]], r: int) -> dict[str, Any]:
    """The count of runs still stuck at round ``r`` (stuck at every evaluation up to it) over the
    runs whose state at ``r`` is known, and the accuracy at ``r`` of the runs evaluated there
    that are not stuck."""
    known = {s: v for s, ev in runs.items() if (v := still_stuck(ev, r)) is not None}
    stuck = sorted(s for s, v in known.items() if v)
    carried = sum(1 for s in known if r not in runs[s])
    # stuck at r after leaving one class earlier (a collapse, not a stuck start): counted apart
    relapsed = sorted(s for s in known if r in runs[s] and runs[s][r]["stuck"] and not known[s])
    trained = [100 * runs[s][r]["accuracy"] for s in known if r in runs[s] and not runs[s][r]["stuck"]]
    return {"round": r, "runs": len(known), "stuck": len(stuck), "stuck_seeds": stuck,
            "rate": len(stuck) / len(known) if known else None, "carried": carried, "relapsed_seeds": relapsed,
            "trained_runs": len(trained),
            "trained_mean": statistics.fmean(trained) if trained else None,
            "trained_std": statistics.stdev(trained) if len(trained) > 1 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", action="append", default=[], metavar="JSONL[,JSONL...]",
                    help="reference loop JSONL (repeatable; comma-separated files merge into one loop, later ones "
                    "continuing runs of earlier ones)")
    ap.add_argument("--fednorm", action="append", default=[], metavar="LABEL=CELL_DIR[,CELL_DIR...]",
                    help="a table cell folder of fednorm runs (seed<k>/metrics.jsonl), e.g. BN=out/table1/bn__phi0.6; "
                    "comma-separated folders merge as --reference's files do")
    ap.add_argument("--rounds", default="20,40", help="rounds at which to count (comma-separated)")
    ap.add_argument("--versus", metavar="LABEL", help="test every loop against the fednorm loop of this label (on "
                    "the seeds both have) instead of against the first reference loop")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    rounds = [int(r) for r in args.rounds.split(",")]
    loops: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    notes: dict[str, str] = {}
    for item in args.reference:
        paths = [Path(p) for p in item.split(",")]
        loops["reference loop (" + ", ".join(p.name for p in paths) + ")"] = merge([reference_runs(p) for p in paths])
    for item in args.fednorm:
        label, _, cells = item.partition("=")
        parts = [fednorm_runs(Path(c)) for c in cells.split(",")]
        loops[f"fednorm {label}"] = merge([runs for runs, _ in parts])
        fallback = any(f for _, f in parts)
        if fallback:
            notes[f"fednorm {label}"] = "some records lack top_class_share: stuck read as accuracy exactly 10.00%"
    table = {name: [rate(runs, r) for r in rounds] for name, runs in loops.items()}
    print("| loop | " + " | ".join(f"still stuck at round {r}" for r in rounds) + " | trained runs' accuracy at round "
          f"{rounds[-1]} (%) |")
    print("|---|" + "---:|" * (len(rounds) + 1))
    for name, rows in table.items():
        cells = [(f"{x['stuck']}/{x['runs']} ({100 * x['rate']:.0f}%)" + (f", {x['carried']} carried" if x["carried"] else "")
                  + (f", relapsed {x['relapsed_seeds']}" if x["relapsed_seeds"] else "")) if x["runs"] else "n/a"
                 for x in rows]
        last = rows[-1]
        acc = (f"{last['trained_mean']:.2f} ± {last['trained_std']:.2f}" if last["trained_std"] is not None
               else (f"{last['trained_mean']:.2f}" if last["trained_mean"] is not None else "n/a"))
        print(f"| {name} | " + " | ".join(cells) + f" | {acc} |")
    tests = {}
    names = list(table)
    if args.versus is not None:
        base = f"fednorm {args.versus}"
        if base not in loops:
            raise SystemExit(f"--versus {args.versus}: no --fednorm {args.versus}=... given")
    else:
        base = names[0] if len(names) >= 2 and names[0].startswith("reference") else None
    if base is not None:
        for name in names:
            if name == base:
                continue
            # on the seeds both have: a seed's rows share partition and client sampling
            common = sorted(set(loops[name]) & set(loops[base]))
            for r in rounds:
                x = rate({s: loops[name][s] for s in common}, r)
                y = rate({s: loops[base][s] for s in common}, r)
                if x["runs"] and y["runs"]:
                    two, greater = fisher_exact(x["stuck"], x["runs"] - x["stuck"], y["stuck"], y["runs"] - y["stuck"])
                    tests.setdefault(name, []).append({"round": r, "versus": base, "seeds": len(common),
                                                       "stuck": [x["stuck"], x["runs"]], "versus_stuck": [y["stuck"], y["runs"]],
                                                       "p_two_sided": two, "p_first_higher": greater})
                    print(f"Fisher, {name} vs {base} on their {len(common)} common seeds, round {r}: "
                          f"{x['stuck']}/{x['runs']} vs {y['stuck']}/{y['runs']}, two-sided p = {two:.4f}, "
                          f"one-sided ({name} higher) p = {greater:.4f}")
    for name, note in notes.items():
        print(f"note, {name}: {note}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"definition": f"stuck: top_class_share >= {STUCK_SHARE}; still stuck at r: "
                                        "stuck at every evaluation up to r", "rounds": rounds,
                                        "rates": table, "fisher": tests, "notes": notes,
                                        "inputs": {"reference": [str(p) for p in args.reference], "fednorm": args.fednorm}},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
