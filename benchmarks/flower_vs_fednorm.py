"""fednorm's simulator against a Flower (flwr 1.41) simulation of the same FedAvg workload.

Workload: CIFAR-10 (``../shared/data``) split Dirichlet(0.6) over ``--clients`` clients, 10
sampled per round, Simple-CNN with BatchNorm, one local epoch of SGD (momentum 0.9) at batch
``--batch-size``, FedAvg weighted by examples, no client-side evaluation. Both sides use the same
partition, the same model and fednorm's own local-training function, so the difference is the
framework: Flower's Ray actors, message serialisation and strategy against fednorm's in-process
executors. Reported: end to end (start to finish, including start-up) and per round.

Flower is an optional dependency of this benchmark only:

    pip install "flwr[simulation]==1.41.0"
    python benchmarks/flower_vs_fednorm.py --data-dir ../shared/data --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import interleaved, print_row, write_result  # noqa: E402

CONFIG: dict = {}
RESULTS: dict = {}


def _client_app():
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:  # runs in a Ray actor
        from fednorm.data.federated import cached_federated_data
        from fednorm.engine.local import LocalSpec, batch_plan, train_local
        from fednorm.engine.rng import torch_generator
        from fednorm.models import get_model

        cfg = CONFIG
        data = cached_federated_data(cfg["dataset"], num_clients=cfg["clients"], partition_name="dirichlet",
                                     seed=cfg["seed"], data_dir=cfg["data_dir"], alpha=0.6, min_size=2)
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        model = get_model("simple_cnn", num_classes=10, in_channels=3, input_size=data.info.image_size, norm="bn")
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        idx = data.client_train[pid]
        gen = torch_generator(cfg["seed"], "batches", rnd, pid)
        plan = batch_plan(len(idx), cfg["batch_size"], epochs=1, generator=gen)
        spec = LocalSpec(batch_size=cfg["batch_size"], momentum=0.9, augment=data.augment)
        train_local(model, data.train_x[idx], data.train_y[idx], plan, lr=0.01, spec=spec, generator=gen)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(idx)})})
        return Message(content, reply_to=msg)

    return app


def _server_app():
    from flwr.app import ArrayRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        import torch

        from fednorm.models import get_model

        torch.manual_seed(CONFIG["seed"])
        model = get_model("simple_cnn", num_classes=10, in_channels=3, input_size=32, norm="bn")
        n, m = CONFIG["clients"], CONFIG["per_round"]
        strategy = FedAvg(fraction_train=m / n, fraction_evaluate=0.0, min_train_nodes=m, min_evaluate_nodes=0,
                          min_available_nodes=n)
        stamps = []

        def evaluate_fn(server_round, arrays):
            stamps.append(time.perf_counter())
            return None

        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=CONFIG["rounds"],
                       timeout=3600, evaluate_fn=evaluate_fn)
        RESULTS["stamps"] = stamps

    return app


def run_flower(args) -> dict:
    from flwr.simulation import run_simulation

    start = time.perf_counter()
    run_simulation(
        server_app=_server_app(), client_app=_client_app(), num_supernodes=args.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": os.cpu_count()}},
    )
    total = time.perf_counter() - start
    stamps = RESULTS["stamps"]
    rounds = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"end_to_end_s": total, "round_s": rounds, "round_s_median": statistics.median(rounds)}


def run_fednorm(args, executor: str) -> dict:
    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation

    start = time.perf_counter()
    cfg = ExperimentConfig(dataset=args.dataset, data_dir=CONFIG["data_dir"], partition="dirichlet", alpha=0.6, min_size=2,
                           num_clients=args.clients, clients_per_round=args.per_round, model="simple_cnn", norm="bn",
                           batch_size=args.batch_size, lr=0.01, momentum=0.9, rounds=10**6, eval_every=10**6,
                           executor=executor, seed=args.seed)
    sim = Simulation(cfg)
    timing = interleaved({"round": sim.step}, args.rounds, warmup=0)
    return {"end_to_end_s": time.perf_counter() - start, "round_s": timing.values("round"),
            "round_s_median": timing.median("round"), "round_cpu_s": timing.values("round", "cpu"),
            "executor": sim.executor.name}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/flower_vs_fednorm.json")
    args = ap.parse_args()
    CONFIG.update(dataset=args.dataset, data_dir=data_dir(args.data_dir) if args.dataset != "digits" else None,
                  clients=args.clients, per_round=args.per_round, batch_size=args.batch_size, rounds=args.rounds,
                  seed=args.seed)
    results = {
        "fednorm vectorized": run_fednorm(args, "vectorized"),
        "fednorm sequential": run_fednorm(args, "sequential"),
        "flower simulation": run_flower(args),
    }
    fl = results["flower simulation"]
    for name, r in results.items():
        print_row(f"{name:20s}", f"end to end {r['end_to_end_s']:7.1f}s  per round {r['round_s_median']:6.2f}s  "
                  f"(flower / this: end to end {fl['end_to_end_s'] / r['end_to_end_s']:.2f}x, "
                  f"per round {fl['round_s_median'] / r['round_s_median']:.2f}x)")
    write_result(args.out, {"benchmark": "flower_vs_fednorm", "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
