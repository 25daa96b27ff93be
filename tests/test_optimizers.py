"""FL optimizers composed with norm methods, end to end: FedBN keeps BN local, HBN learns, resume is exact, CLI."""

import json

import torch

from fednorm import api
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.nn.state import batch_norm_keys
from fednorm.optim.client import SCAFFOLD_PREFIX

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=6, clients_per_round=3, batch_size=32,
            lr=0.05, momentum=0.9, model="simple_cnn", seed=1, threads=1)


def _no_time(history):
    return [{k: v for k, v in h.items() if k != "wall_seconds"} for h in history]


def test_fedbn_with_scaffold_and_yogi_keeps_bn_local_and_learns():
    sim = Simulation(ExperimentConfig(**BASE, rounds=8, eval_every=8, norm="bn", method="fedbn", client_opt="scaffold", server_opt="yogi",
                                      server_opt_args={"server_lr": 0.03}))
    init = {k: v.clone() for k, v in sim.global_state.items()}
    bn = batch_norm_keys(sim.model)
    for _ in sim.rounds():
        pass
    assert bn and bn == sim.method.local_keys
    # BN tensors never reach the server: the global copies are untouched, every client has its own
    for k in bn:
        assert torch.equal(sim.global_state[k], init[k]), k
    trained = [c for c in sim.bank if any(k.startswith(SCAFFOLD_PREFIX) for k in sim.bank.get(c))]
    assert len(trained) >= 2
    a, b = (sim.bank.get(c) for c in trained[:2])
    assert not torch.equal(a[next(k for k in bn if k.endswith("running_mean"))], b[next(k for k in bn if k.endswith("running_mean"))])
    # neither SCAFFOLD nor Yogi keeps state for local tensors
    assert not (set(sim.method.client_opt.c) & bn) and not (set(sim.method.server_opt.moments) & bn)
    assert sim.history[-1]["test_accuracy"] > 0.6


def test_hbn_with_scaffold_and_fedadam_runs_and_learns():
    sim = Simulation(ExperimentConfig(**BASE, rounds=8, eval_every=8, norm="hbn", method="hbn", client_opt="scaffold", server_opt="fedadam",
                                      server_opt_args={"server_lr": 0.03}))
    for _ in sim.rounds():
        pass
    assert sim.method.name == "hbn" and "scaffold" in sim.method.summary() and "fedadam" in sim.method.summary()
    alpha = [k for k in sim.method.local_keys if k.endswith("alpha")]
    assert alpha and not (set(sim.method.server_opt.moments) & set(alpha))
    assert "hbn_batch_weight" in sim.summary()["method_report"]
    assert sim.history[-1]["test_accuracy"] > 0.6


def test_hbn_with_moon_and_fedprox_run():
    for opt, args in (("moon", {"mu": 1.0}), ("fedprox", {"mu": 0.01})):
        kw = dict(BASE, batch_size=16)
        sim = Simulation(ExperimentConfig(**kw, rounds=4, eval_every=4, norm="hbn", method="hbn", client_opt=opt, client_opt_args=args))
        for _ in sim.rounds():
            pass
        assert sim.history[-1]["test_accuracy"] > 0.5, opt


def test_resume_with_server_and_client_optimizers_equals_uninterrupted_run(tmp_path):
    kw = dict(BASE, model="mlp", norm="bn", client_opt="scaffold", server_opt="fedyogi", checkpoint_every=2)
    full = api.run(rounds=6, out=str(tmp_path / "full"), progress=False, **kw)
    api.run(rounds=3, out=str(tmp_path / "part"), progress=False, **kw)
    resumed = api.run(resume=tmp_path / "part", rounds=6, progress=False)
    assert resumed.summary["rounds"] == 6
    assert _no_time(resumed.history) == _no_time(full.history)
    for key, value in full.simulation.global_state.items():
        assert torch.equal(resumed.simulation.global_state[key], value), key
    a, b = full.simulation.method, resumed.simulation.method
    for key, c in a.client_opt.c.items():
        assert torch.equal(b.client_opt.c[key], c), key
    for key, m in a.server_opt.moments.items():
        assert torch.equal(b.server_opt.moments[key]["v"], m["v"]) and torch.equal(b.server_opt.moments[key]["m"], m["m"])


def test_cli_composes_method_client_and_server_optimizers(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--method", "hbn", "--norm", "hbn", "--client-opt", "scaffold", "--server-opt", "yogi",
                 "--rounds", "2", "--num-clients", "4", "--model", "mlp", "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "scaffold" in summary["method_summary"] and "fedyogi" in summary["method_summary"]
    assert "client_opt: scaffold" in (out / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["list", "client_opts"]) == 0
    assert capsys.readouterr().out.strip() == "client_opts: fedacg, feddecorr, fedlc, fedprox, fedrs, fedsam, moon, none, scaffold"
    assert main(["run", "--client-opt", "scafold", "--rounds", "1"]) == 2
    assert "Did you mean 'scaffold'" in capsys.readouterr().err


def test_scaffold_counts_its_control_variates_both_ways():
    """Each sampled client downloads the server's c and uploads its delta c_i: two parameter-sized
    messages per client per round on top of FedAvg's traffic."""
    cfg = dict(BASE, rounds=2, eval_every=2, norm="bn", method="fedavg")
    plain = Simulation(ExperimentConfig(**cfg))
    scaffold = Simulation(ExperimentConfig(**cfg, client_opt="scaffold"))
    list(plain.rounds())
    list(scaffold.rounds())
    params = dict(scaffold.model.named_parameters())
    c_bytes = sum(params[k].numel() * params[k].element_size() for k in scaffold.method.client_opt.c)
    assert c_bytes == sum(p.numel() * p.element_size() for p in scaffold.model.parameters())  # every parameter is shared
    sent = 2 * 3  # rounds x clients per round
    assert scaffold.downlink_bytes - plain.downlink_bytes == sent * c_bytes
    assert scaffold.uplink_bytes - plain.uplink_bytes == sent * c_bytes
