"""The diagnostics' cost (``--diagnostics every:N``, docs/diagnostics.md) as a fraction of a round.

For each method, one :class:`~fednorm.engine.simulator.Simulation` of the embedded digits
(Dirichlet, 10 clients all training every round); after a warm-up round, ``--repeats`` times:
one round (local training, the method's client hooks and the server update, as the round's
``record.seconds``; evaluation is not part of it), then one call of the diagnostics on the
resulting state, timed alone. Prints the medians side by side and their ratio: the cost of
``every:1``; ``every:N`` costs the ratio / N.

    OMP_NUM_THREADS=1 python benchmarks/diagnostics_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import interleaved, print_row, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.diagnostics import Diagnostics  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("FedAvg+BN", dict(method="fedavg", norm="bn")),
    ("FedBN", dict(method="fedbn", norm="bn")),
    ("FBN", dict(method="fbn", norm="fbn")),
    ("HBN", dict(method="hbn", norm="hbn")),
    ("FedTAN", dict(method="fedtan", norm="bn")),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-clients", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/diagnostics_cost.json")
    args = p.parse_args()
    rows = []
    print_row(f"{args.repeats} repeats", "medians:")
    print(f"{'method':<10} {'round s':>9} {'diagnostics s':>14} {'ratio':>7}")
    for label, overrides in VARIANTS:
        cfg = ExperimentConfig(num_clients=args.num_clients, alpha=args.alpha, rounds=10**4, eval_every=10**4,
                               threads=args.threads, seed=0, **overrides)
        sim = Simulation(cfg)
        diag = Diagnostics(1)
        seconds: list[float] = []  # each round's own record.seconds, as a run reports it

        def one_round(sim: Simulation = sim, seconds: list[float] = seconds) -> None:
            seconds.append(sim.step().seconds)

        timing = interleaved({"round": one_round, "diagnostics": lambda sim=sim, diag=diag: diag(sim)}, args.repeats,
                             warmup=1, baseline="round")
        rounds = seconds[1:]  # not the warm-up round
        r, d = statistics.median(rounds), timing.median("diagnostics")
        rows.append({"method": label, "round_seconds": r, "diagnostics_seconds": d, "ratio": d / r,
                     "ratio_paired": timing.ratio("diagnostics", "round"), "rounds": rounds,
                     "diagnostics": timing.values("diagnostics"), "raw": timing.runs})
        print(f"{label:<10} {r:>9.3f} {d:>14.3f} {d / r:>7.2f}", flush=True)
    write_result(args.out, {"setting": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
