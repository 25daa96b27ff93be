"""One federated round against centralized training of the same model at the same batch size.

The foundation issue's reference measurement: CIFAR-10, 100 clients (Dirichlet 0.6), 10
sampled per round, HBN's Simple-CNN, batch 4, SGD momentum 0.9, random crop + flip. A
fednorm round (sequential executor) and a plain centralized PyTorch loop over the same number
of samples run interleaved in one process, ``--repeats`` times; the medians are compared, and
beside them the median of the per-repeat paired ratios.

    python benchmarks/round_vs_centralized.py --data-dir ../shared/data

The centralized loop is the fastest plain loop we know (tensors in memory, one index_select
per batch, the same augmentation), so the ratio measures the engine's overhead, not a
DataLoader's.

``--versus COMMIT`` times HBN Table 1's BN row instead (configs/reproduce/hbn/table1.yaml: base and
the ``bn`` row, one run, its evaluation every ``eval_every`` rounds) at this commit and at
``COMMIT`` (a temporary ``git worktree``), in two worker processes that train the same rounds of
the same run, round by round in alternating order (ABBA); round 1 (first-call costs) is not
timed. Each block of ``eval_every`` consecutive timed rounds holds one evaluation, the table's
cadence; the paired ratio is this commit's block time over ``COMMIT``'s, median over blocks. Each
worker also sums the wall and CPU time its steps spend drawing the crops and gathering the batches
(the step feed, ``fednorm/engine/feed.py``, or the per-row ``_gather`` before it), as shares of the
round's wall and CPU time. On a machine shared with other work, the CPU figures are the steadier:

    python benchmarks/round_vs_centralized.py --data-dir ../shared/data --versus ea4d3ad --blocks 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir, train_centralized  # noqa: E402
from benchmarks.harness import ROOT, Record, interleaved, print_row, write_result  # noqa: E402

_CODE = "FEDNORM_BENCH_CODE"  # a --versus worker times the fednorm of this tree (another commit's worktree)
if os.environ.get(_CODE):
    sys.path.insert(0, os.environ[_CODE])

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402


def centralized(sim: Simulation, num_samples: int, batch_size: int, lr: float, seed: int, channels_last: bool = False) -> int:
    """Plain PyTorch: the same model and augmentation, shuffled batches of the whole training set."""
    sim.model.load_state_dict(sim.global_state)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(sim.data.train_x), generator=g)
    batches = [perm[i * batch_size : (i + 1) * batch_size] for i in range(num_samples // batch_size)]
    return train_centralized(sim.model, sim.data.train_x, sim.data.train_y, batches, lr=lr, generator=g,
                             augment=True, channels_last=channels_last)


TABLE1 = ROOT / "configs" / "reproduce" / "hbn" / "table1.yaml"
_MARK = "@@round "  # a worker's reply lines (the code it runs may print)


def table1_bn(data_dir_: str) -> dict:
    """HBN Table 1's BN run as the reproduce config sets it: the base, then the ``bn`` row."""
    import yaml

    spec = yaml.safe_load(TABLE1.read_text())
    row = next(r for r in spec["rows"] if r["id"] == "bn")
    return {**spec["base"], **row["set"], "data_dir": data_dir_}


def _timed_feed(totals: dict[str, float]) -> None:
    """Add the wall and CPU time spent in the step feed's calls (or, before it, the per-row gather)
    to ``totals["feed"]`` and ``totals["feed_cpu"]``."""
    from fednorm.engine import vectorized

    targets = [(vectorized.VectorizedExecutor, "_gather")]
    try:
        from fednorm.engine import feed
    except ImportError:  # before issue 49
        feed = None
    if feed is not None:
        targets += [(feed.StepFeed, "__init__"), (feed.StepFeed, "batch")]
    for owner, name in targets:
        real = getattr(owner, name)

        def timed(*args, _real=real, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return _real(*args, **kwargs)
            finally:
                totals["feed"] += time.perf_counter() - t0
                totals["feed_cpu"] += time.process_time() - c0

        setattr(owner, name, timed)


def worker(config: dict, threads: int) -> None:
    """One side of ``--versus``: build the run, then one round per ``step`` line on stdin, each
    answered by a line of its wall and CPU seconds, samples, whether it evaluated, and feed seconds."""
    torch.set_num_threads(threads)
    totals = {"feed": 0.0, "feed_cpu": 0.0}
    _timed_feed(totals)
    cfg = ExperimentConfig(**config)
    sim = Simulation(cfg)
    print(_MARK + json.dumps({"executor": sim.executor.name}), flush=True)
    while sys.stdin.readline().strip() == "step":
        totals["feed"] = totals["feed_cpu"] = 0.0
        w0, c0 = time.perf_counter(), time.process_time()
        record = sim.step()
        w1, c1 = time.perf_counter(), time.process_time()
        print(_MARK + json.dumps({"round": record.server_round, "wall": w1 - w0, "cpu": c1 - c0, "feed": totals["feed"], "feed_cpu": totals["feed_cpu"],
                                  "samples": sim.executor.last_samples_seen,
                                  "evaluated": record.server_round % cfg.eval_every == 0}), flush=True)


class _Worker:
    def __init__(self, code: Path, config: dict, threads: int) -> None:
        env = {**os.environ, _CODE: str(code), "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(config), "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._reply()

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK):])
        raise RuntimeError(f"worker exited with {self.proc.wait()}")

    def step(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def _commit(ref: str, cwd: Path) -> str:
    return subprocess.run(["git", "rev-parse", ref], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def versus(args: argparse.Namespace) -> None:
    """This commit's HBN Table 1 BN round against ``args.versus``'s (module docstring)."""
    config = table1_bn(data_dir(args.data_dir))
    every = config["eval_every"]
    other = _commit(args.versus, ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="fednorm_versus_"))
    subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "tree"), other], cwd=ROOT, check=True,
                   capture_output=True)
    workers: dict[str, _Worker] = {}
    try:
        print(f"building the run at this commit and at {other[:7]} ...", flush=True)
        workers = {"this": _Worker(ROOT, config, args.threads), "versus": _Worker(tmp / "tree", config, args.threads)}
        rounds: dict[str, list[dict]] = {name: [] for name in workers}
        for name, w in workers.items():  # round 1: first-call costs, not timed
            w.step()
        for i in range(args.blocks * every):
            order = ["this", "versus"] if i % 2 == 0 else ["versus", "this"]
            for name in order:
                rounds[name].append(workers[name].step())
            r = rounds["this"][-1]
            print(f"round {r['round']}: this {r['wall']:.2f}s (feed {r['feed']:.3f}s{', evaluated' if r['evaluated'] else ''}), "
                  f"{other[:7]} {rounds['versus'][-1]['wall']:.2f}s", flush=True)
    finally:
        for w in workers.values():
            w.close()
        subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "tree")], cwd=ROOT, capture_output=True)

    def block_sums(name: str, key: str) -> list[float]:
        xs = [r[key] for r in rounds[name]]
        return [sum(xs[b * every:(b + 1) * every]) for b in range(args.blocks)]

    assert all(sum(r["evaluated"] for r in rounds[n][b * every:(b + 1) * every]) == 1
               for n in rounds for b in range(args.blocks))
    wall = {n: block_sums(n, "wall") for n in rounds}
    cpu = {n: block_sums(n, "cpu") for n in rounds}
    feed = {n: block_sums(n, "feed") for n in rounds}
    feed_cpu = {n: block_sums(n, "feed_cpu") for n in rounds}
    per_round = {n: statistics.median(w) / every for n, w in wall.items()}
    summary = {
        "seconds_per_round": per_round,
        "ratio_paired": statistics.median(a / b for a, b in zip(wall["this"], wall["versus"])),
        "cpu_ratio_paired": statistics.median(a / b for a, b in zip(cpu["this"], cpu["versus"])),
        "feed_share": {n: statistics.median(f / w for f, w in zip(feed[n], wall[n])) for n in rounds},
        "feed_cpu_share": {n: statistics.median(f / c for f, c in zip(feed_cpu[n], cpu[n])) for n in rounds},
    }
    print_row("result", f"HBN Table 1 BN round with its evaluation every {every}: this commit "
              f"{per_round['this']:.2f} s, {other[:7]} {per_round['versus']:.2f} s per round; paired ratio "
              f"{summary['ratio_paired']:.3f} (CPU {summary['cpu_ratio_paired']:.3f}); step feed (crop draws + batch "
              f"gathering) {100 * summary['feed_share']['this']:.1f}% of the round's wall time here "
              f"({100 * summary['feed_cpu_share']['this']:.1f}% of its CPU time), "
              f"{100 * summary['feed_share']['versus']:.1f}% ({100 * summary['feed_cpu_share']['versus']:.1f}%) at {other[:7]}")
    out = args.out or "benchmarks/results/round_vs_commit_hbn_table1_bn.json"
    write_result(out, {
        "benchmark": "round_vs_commit", "config": config, "executor": workers["this"].info["executor"],
        "versus_executor": workers["versus"].info["executor"], "versus_commit": other, "blocks": args.blocks,
        "eval_every": every, "summary": summary,
        "blocks_wall_s": wall, "blocks_cpu_s": cpu, "blocks_feed_s": feed, "blocks_feed_cpu_s": feed_cpu, "raw": rounds,
    })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--num-clients", type=int, default=100)
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--executor", default="auto", choices=["auto", "sequential", "vectorized"])
    ap.add_argument("--out", default=None, help="default: benchmarks/results/round_vs_centralized_<executor>_b<B>.json")
    ap.add_argument("--versus", metavar="COMMIT",
                    help="time HBN Table 1's BN round here against COMMIT instead (module docstring)")
    ap.add_argument("--blocks", type=int, default=3, help="--versus: timed blocks of eval_every rounds")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker), args.threads or 1)
    if args.versus:
        args.threads = args.threads or 1
        return versus(args)
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = ExperimentConfig(
        dataset="cifar10", data_dir=data_dir(args.data_dir), partition="dirichlet", alpha=0.6,
        num_clients=args.num_clients, clients_per_round=args.clients_per_round, model=args.model, norm=args.norm,
        batch_size=args.batch_size, lr=0.01, momentum=0.9, rounds=10_000, eval_every=10_000, executor=args.executor,
    )
    print(f"building {cfg.num_clients} clients of CIFAR-10 ...", flush=True)
    sim = Simulation(cfg)
    rounds: list[int] = []  # the server round of each repeat's fednorm round, which runs first

    def fed() -> int:
        rounds.append(sim.step().server_round)
        return sim.executor.last_samples_seen

    def central(channels_last: bool) -> int:  # this repeat's samples; the repeat's index seeds both loops
        return centralized(sim, sim.executor.last_samples_seen, args.batch_size, cfg.lr, len(rounds) - 1, channels_last)

    def progress(rep: int, r: dict[str, Record]) -> None:
        print(f"repeat {rep + 1}: round {rounds[-1]} with {r['fednorm']['samples']} samples in {r['fednorm']['wall']:.2f}s "
              f"({r['fednorm']['rate']:.0f} samples/s); centralized {r['centralized']['rate']:.0f} samples/s "
              f"(channels-last {r['centralized CL']['rate']:.0f})", flush=True)

    timing = interleaved({"fednorm": fed, "centralized": lambda: central(False), "centralized CL": lambda: central(True)},
                         args.repeats, warmup=0, baseline="centralized", on_repeat=progress)
    fed_rate, cen, cl = (timing.median(n, "rate") for n in ("fednorm", "centralized", "centralized CL"))
    paired, paired_cl = timing.ratio("fednorm", "centralized", "rate"), timing.ratio("fednorm", "centralized CL", "rate")
    print_row(f"median over {args.repeats}:",
              f"fednorm round ({sim.executor.name}) {fed_rate:.0f} samples/s, centralized {cen:.0f} "
              f"samples/s (channels-last {cl:.0f}); ratio {fed_rate / cen:.3f}x ({fed_rate / cl:.3f}x vs channels-last), "
              f"paired {paired:.3f}x ({paired_cl:.3f}x); one round takes {timing.median('fednorm'):.2f}s")
    out = args.out or f"benchmarks/results/round_vs_centralized_{sim.executor.name}_b{args.batch_size}.json"
    write_result(out, {
        "benchmark": "round_vs_centralized",
        "config": cfg.model_dump(mode="json"),
        "fednorm_samples_per_s": timing.values("fednorm", "rate"),
        "centralized_samples_per_s": timing.values("centralized", "rate"),
        "centralized_channels_last_samples_per_s": timing.values("centralized CL", "rate"),
        "executor": sim.executor.name,
        # ratios of the medians, as docs/performance.md quotes them; the paired ratios beside them
        "ratio_vs_channels_last": fed_rate / cl,
        "round_seconds": timing.values("fednorm"),
        "samples_per_round": timing.values("fednorm", "samples"),
        "ratio_median": fed_rate / cen,
        "ratio_paired": paired,
        "ratio_vs_channels_last_paired": paired_cl,
        "raw": timing.runs,
    })


if __name__ == "__main__":
    main()
