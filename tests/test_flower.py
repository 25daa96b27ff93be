"""fednorm on Flower (flwr 1.41): same config, same method code, same metrics as in-process.

1. In-process: the ClientApp's handlers called directly (fast): a train reply holds exactly the
   engine's own client update, and the node keeps its clients' local state in ``context.state``;
   a grid that calls the ClientApp in-process runs whole experiments (FedBN, HBN, SCAFFOLD with
   FedAdam) to the in-process simulator's metrics.
2. Flower's simulation engine (Ray, 2 virtual SuperNodes): HBN, metrics equal to in-process, through
   ``run_simulation`` and through ``flwr run`` against a simulation SuperLink.
3. A real deployment over loopback: a SuperLink and 2 SuperNodes started here, ``flwr run`` of
   2 rounds of FedBN; the run directory's metrics equal the in-process run's.
4. The same with TLS (certificates generated here) and SuperNode authentication (EC keys
   generated here and registered with ``flwr supernode register``), SCAFFOLD: its control
   variates live on the nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the Flower extra (flwr) is not installed")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from _compare import assert_close_tree  # noqa: E402
from fednorm.api import run  # noqa: E402
from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.remote import host_of  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=5, rounds=2, local_epochs=1, batch_size=32,
            lr=0.1, momentum=0.9, model="mlp", model_args={"hidden": 32}, dtype="float64", augment=False, threads=1,
            eval_every=1, seed=3)
CASES: dict[str, dict] = {
    "fedbn": dict(method="fedbn", norm="bn"),
    "hbn": dict(method="hbn", norm="hbn", batch_size=16),
    "scaffold+fedadam, 3 of 5": dict(method="fedavg", norm="bn", clients_per_round=3, client_opt="scaffold",
                                     server_opt="fedadam", server_opt_args={"server_lr": 0.01}),
}
# Every other round-based family once more (equivalence only: 2-3 rounds need not learn here).
MORE_CASES: dict[str, dict] = {
    "silobn": dict(method="silobn", norm="bn"),
    "hbn, 3 of 5, eval_resync all": dict(method="hbn", norm="hbn", batch_size=16, clients_per_round=3,
                                        method_args={"eval_resync": "all"}),
    "fixbn": dict(method="fixbn", norm="bn", method_args={"switch_round": 1}),
    "fedavg+ln+fedprox": dict(method="fedavg", norm="ln", client_opt="fedprox"),
    "fedavg+fn+moon+fedavgm": dict(method="fedavg", norm="fn", model="simple_cnn", model_args={}, client_opt="moon",
                                   server_opt="fedavgm"),
    "fbn, dsgd": dict(method="fbn", norm="fbn", dsgd=True, batch_size=16, model="fedbn_cnn", model_args={}, rounds=3,
                      eval_every=3),
    "fbn, round_average": dict(method="fbn", norm="fbn", method_args={"mode": "round_average", "initial_pass": False}),
}
KEEP = ("test_accuracy", "test_loss", "mean_client_accuracy", "client_accuracies", "train_loss", "uplink_bytes",
        "downlink_bytes", "samples_trained")
ROOT = Path(__file__).resolve().parents[1]


def _config(case: str, **extra) -> ExperimentConfig:
    return ExperimentConfig(**{**BASE, **{**CASES, **MORE_CASES}[case], **extra})


def _metrics(history: list[dict], summary: dict) -> dict:
    return {"history": [{k: h[k] for k in KEEP} for h in history], "final_sync": summary.get("final_sync"),
            "method_report": summary.get("method_report")}


_close = assert_close_tree


def _reference(cfg: ExperimentConfig, learns: bool = True) -> dict:
    result = run(cfg, write=False, progress=False)
    if learns:
        assert result.history[-1]["test_accuracy"] > 0.2  # the run learns something
    return json.loads(json.dumps(_metrics(result.history, result.summary)))


# -- 1. in-process: the ClientApp called directly ------------------------------------------------

def _identity() -> None:
    """Messages need a task identity outside a Flower runtime (private API; see the notes)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


class InProcessGrid(Grid):
    """A grid whose nodes are ClientApp calls in this process, each with its own Context."""

    def __init__(self, client_app, num_nodes: int) -> None:
        _identity()
        self.client_app = client_app
        self.outbox: dict = {}
        self.contexts = {
            100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i, "num-partitions": num_nodes},
                             state=RecordDict(), run_config={})
            for i in range(num_nodes)
        }

    def set_run(self, run) -> None:  # noqa: D102
        pass

    @property
    def run(self):  # noqa: D102
        return None

    def create_message(self, *args, **kwargs):  # noqa: D102
        raise NotImplementedError

    def get_node_ids(self):  # noqa: D102
        return list(self.contexts)

    def push_messages(self, messages):  # noqa: D102 - runs the ClientApp at once; pull returns the replies
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as flwr's InMemoryGrid does
            self.outbox[m.metadata.message_id] = self.client_app(m, self.contexts[m.metadata.dst_node_id])
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):  # noqa: D102
        return [self.outbox.pop(i) for i in list(message_ids) if i in self.outbox]

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        return self.pull_messages(self.push_messages(messages))


def test_train_reply_is_the_engines_client_update_and_local_state_stays_on_the_node():
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.node import BANK_KEY
    from fednorm.flower.records import record_to_bank, record_to_updates
    from fednorm.flower.runtime import FlowerSimulation

    cfg = _config("fedbn")
    grid = InProcessGrid(client_app, 2)
    server = FlowerSimulation(cfg, grid=grid, nodes=grid.get_node_ids())
    reference = Simulation(cfg)  # trains the same clients in-process
    clients = [0, 1, 2, 3, 4]
    for r in (1, 2):
        content = server._content(clients, server_round=r, lr=cfg.lr)
        node = 101  # partition 1 hosts clients 1 and 3
        reply = client_app(Message(content, dst_node_id=node, message_type="train", group_id=str(r)), grid.contexts[node])
        assert not reply.has_error()
        got = record_to_updates(reply.content["updates"], reply.content["fednorm"])
        want = reference.executor.run_round(r, [1, 3], reference.global_state, cfg.lr)
        assert got.client_ids == want.client_ids == [1, 3]
        for k, v in want.states.items():
            assert got.states[k].dtype == v.dtype and torch.equal(got.states[k], v), k
        for name in ("num_examples", "train_loss", "num_steps"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        # the node's persistent state holds exactly its clients' local (BN) tensors
        bank = record_to_bank(grid.contexts[node].state[BANK_KEY])
        assert sorted(bank) == [1, 3]
        for cid in (1, 3):
            ref = reference.bank.get(cid)
            assert bank[cid].keys() == ref.keys() and all(torch.equal(bank[cid][k], ref[k]) for k in ref)
        assert all(host_of(c, 2) == 1 for c in bank)


@pytest.mark.parametrize("case", [*CASES, *MORE_CASES])
def test_in_process_grid_runs_give_the_simulators_metrics(case):
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import simulation_factory

    cfg = _config(case)
    grid = InProcessGrid(client_app, 2)
    result = run(cfg, write=False, progress=False, simulation=simulation_factory(grid, grid.get_node_ids(), 60.0))
    _close(json.loads(json.dumps(_metrics(result.history, result.summary))), _reference(cfg, case in CASES), case)


@pytest.mark.parametrize("case", ["fedbn", "scaffold+fedadam, 3 of 5"])
def test_validation_on_flower_nodes_gives_the_simulators_figures_and_selection(case):
    """Each node holds out the same validation samples of its clients as an in-process run
    (validation_fraction) and scores them with the same models: the validation figures of every
    evaluation and summary.json's best-validation selection are the simulator's."""
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import simulation_factory

    cfg = _config(case, validation_fraction=0.3, rounds=3)
    grid = InProcessGrid(client_app, 2)
    got = run(cfg, write=False, progress=False, simulation=simulation_factory(grid, grid.get_node_ids(), 60.0))
    want = run(cfg, write=False, progress=False)
    keys = ("val_accuracy", "val_loss", "client_val_accuracies", "test_accuracy", "client_accuracies")
    selection = ("best_val_round", "best_val_accuracy", "best_val_test_accuracy", "best_val_client_accuracies",
                 "client_best_val_rounds", "client_best_val_test_accuracies")

    def figures(result) -> dict:
        return json.loads(json.dumps({"history": [{k: h[k] for k in keys if k in h} for h in result.history],
                                      "selection": {k: result.summary[k] for k in selection if k in result.summary}}))

    reference = figures(want)
    assert all("client_val_accuracies" in h for h in reference["history"]) and reference["selection"]["best_val_round"]
    _close(figures(got), reference, case)


def test_a_failed_node_drops_its_clients_and_min_clients_decides():
    from fednorm.errors import RoundFailedError
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import FlowerSimulation

    class OneDeadNode(InProcessGrid):
        def pull_messages(self, message_ids):
            return [r for r in super().pull_messages(message_ids) if r.metadata.src_node_id != 100]

    grid = OneDeadNode(client_app, 2)
    sim = FlowerSimulation(_config("fedbn", min_clients=1), grid=grid, nodes=grid.get_node_ids(), timeout=0.3)
    updates = sim.train_clients(1, [0, 1, 2, 3, 4], 0.1)
    assert updates.client_ids == [1, 3]  # partition 1's clients
    assert sorted(updates.failures) == [0, 2, 4] and "no reply" in updates.failures[0]
    strict = FlowerSimulation(_config("fedbn", min_clients=3), grid=grid, nodes=grid.get_node_ids(), timeout=0.3)
    with pytest.raises(RoundFailedError, match="fewer than min_clients=3"):
        strict.step()


def test_a_divergence_on_a_node_stops_the_run_as_in_process():
    from fednorm.errors import DivergenceError
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import simulation_factory

    cfg = _config("fedbn", lr=1e12, momentum=0.0)
    with pytest.raises(DivergenceError) as local:
        run(cfg, write=False, progress=False)
    grid = InProcessGrid(client_app, 2)
    with pytest.raises(DivergenceError) as remote:
        run(cfg, write=False, progress=False, simulation=simulation_factory(grid, grid.get_node_ids(), 5.0))
    assert str(remote.value).endswith(str(local.value))  # the same client, round and step, named by its node


def test_misconfigured_supernodes_are_named():
    from fednorm.errors import ConfigError
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import FlowerSimulation

    grid = InProcessGrid(client_app, 2)
    grid.contexts[101].node_config = {"partition-id": 0, "num-partitions": 2}
    sim = FlowerSimulation(_config("fedbn"), grid=grid, nodes=grid.get_node_ids())
    with pytest.raises(ConfigError, match="two SuperNodes have partition-id 0"):
        sim.train_clients(1, [0, 1], 0.1)
    grid.contexts[101].node_config = {}
    with pytest.raises(ConfigError, match="--node-config 'partition-id=I num-partitions=N'"):
        sim.train_clients(1, [0, 1], 0.1)


def test_run_config_reads_the_experiment_from_the_app_directory(tmp_path):
    from fednorm.flower.server_app import config_from_run_config

    (tmp_path / "experiment.yaml").write_text("dataset: digits\nmethod: fedbn\nrounds: 7\n")
    cfg = config_from_run_config({"config": "experiment.yaml", "overrides": "{rounds: 3, lr: 0.5}", "out": "/x/run"},
                                 base=tmp_path)
    assert (cfg.method, cfg.rounds, cfg.lr, cfg.out) == ("fedbn", 3, 0.5, "/x/run")


def test_lockstep_methods_are_refused_with_a_pointer_to_launch():
    from fednorm.errors import ConfigError
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import FlowerSimulation

    grid = InProcessGrid(client_app, 2)
    with pytest.raises(ConfigError, match="fednorm launch"):
        FlowerSimulation(ExperimentConfig(**{**BASE, "method": "fedtan", "norm": "bn"}), grid=grid, nodes=[100, 101])


def test_flower_app_command_writes_the_app_and_refuses_fedtan(tmp_path, capsys):
    import tomllib

    from fednorm.cli.main import main
    from fednorm.config import load_config

    assert main(["flower-app", str(tmp_path / "app"), "--method", "fedbn", "--rounds", "3", "--num-nodes", "3"]) == 0
    app = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fednorm.flower.server_app:app", "clientapp": "fednorm.flower.client_app:app"}
    assert app["config"]["config"] == "experiment.yaml" and app["config"]["num-nodes"] == 3
    cfg = load_config(tmp_path / "app" / "experiment.yaml")
    assert (cfg.method, cfg.rounds) == ("fedbn", 3)
    assert main(["flower-app", str(tmp_path / "bad"), "--method", "fedtan"]) == 2
    assert "fednorm launch" in capsys.readouterr().err


def test_a_flower_checkpoint_resumes_on_fresh_nodes_to_the_same_metrics(tmp_path):
    """The clients' local state is collected from the nodes into the checkpoint, and a resumed
    run pushes it to new nodes (empty context.state), so it continues exactly."""
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import simulation_factory

    cfg = _config("fedbn", rounds=1, out=str(tmp_path / "run"))
    grid = InProcessGrid(client_app, 2)
    run(cfg, progress=False, simulation=simulation_factory(grid, grid.get_node_ids(), 60.0))
    fresh = InProcessGrid(client_app, 2)  # new nodes: empty context.state
    resumed = run(resume=tmp_path / "run", rounds=2, progress=False,
                  simulation=simulation_factory(fresh, fresh.get_node_ids(), 60.0))
    _close(json.loads(json.dumps(_metrics(resumed.history, resumed.summary))), _reference(_config("fedbn")), "resume")


def test_after_a_resume_each_node_gets_its_clients_state_back_until_it_answers(tmp_path):
    from fednorm.flower.client_app import app as client_app
    from fednorm.flower.runtime import simulation_factory

    grid = InProcessGrid(client_app, 2)
    run(_config("fedbn", rounds=1, out=str(tmp_path / "run")), progress=False,
        simulation=simulation_factory(grid, grid.get_node_ids(), 60.0))

    class FirstReplyOfNode100Lost(InProcessGrid):
        sent: list = []

        def push_messages(self, messages):
            messages = list(messages)
            self.sent.append({m.metadata.dst_node_id: "bank" in m.content.array_records for m in messages})
            return super().push_messages(messages)

        def pull_messages(self, message_ids):
            got = super().pull_messages(message_ids)
            return [r for r in got if len(self.sent) > 1 or r.metadata.src_node_id != 100]

    flaky = FirstReplyOfNode100Lost(client_app, 2)
    resumed = run(resume=tmp_path / "run", rounds=3, progress=False,
                  simulation=simulation_factory(flaky, flaky.get_node_ids(), 0.3))
    assert resumed.summary["status"] == "completed" and resumed.summary["dropped_clients"] == {"error": 3}
    assert flaky.sent[0] == {100: True, 101: True}  # round 2's train: both get the checkpoint's state
    assert flaky.sent[1] == {100: True, 101: False}  # node 100 did not answer: it gets it again, 101 not
    assert all(not any(s.values()) for s in flaky.sent[2:])


def test_records_round_trip_keeps_dtypes_and_bfloat16():
    from fednorm.flower.records import pack_tree, record_to_tensors, tensors_to_record, unpack_tree

    _identity()
    t = {"w": torch.randn(3, 2, dtype=torch.float64), "n": torch.tensor(7), "b": torch.randn(4).to(torch.bfloat16),
         "e": torch.zeros(0, 3)}
    back = record_to_tensors(tensors_to_record(t))
    assert all(back[k].dtype == t[k].dtype and torch.equal(back[k], t[k]) for k in t)
    tree = {"c": {"x": t["w"]}, "moments": {}, "round": 3, "ids": [1, 2], 5: "int key"}
    tensors, skeleton = pack_tree(tree)
    again = unpack_tree(record_to_tensors(tensors_to_record(tensors)), skeleton)
    assert torch.equal(again["c"]["x"], t["w"]) and again["round"] == 3 and again["ids"] == [1, 2]
    assert again[5] == "int key" and again["moments"] == {}


# -- 2. Flower's simulation engine (Ray) ---------------------------------------------------------

@pytest.mark.slow
def test_flower_simulation_engine_gives_the_simulators_metrics():
    pytest.importorskip("ray")
    from fednorm.flower import run_simulation

    cfg = _config("hbn")
    result = run_simulation(cfg, num_nodes=2, num_cpus=2, cpus_per_node=1, write=False)
    assert result.summary["runtime"] == "Flower (2 SuperNodes)"
    _close(json.loads(json.dumps(_metrics(result.history, result.summary))), _reference(cfg), "hbn")


# -- 3./4. a real deployment over loopback -------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tls_files(d: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost (EC P-256)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer: str, signer, ca: bool, san: bool):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, srv_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("fednorm-test-ca", ca_key, "fednorm-test-ca", ca_key, True, False)
    srv = cert("localhost", srv_key, "fednorm-test-ca", ca_key, False, True)
    files = {"ca": d / "ca.crt", "cert": d / "server.pem", "key": d / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(srv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return files


def _node_keys(d: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's EC key pair in OpenSSH format (what flwr 1.41's node authentication reads)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = d / f"{name}", d / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return private, public


def _deploy_doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    return [block.split("\n", 1)[1] for block in text.split("```")[1::2] if block.startswith("bash")]


def test_deploy_doc_uses_flwr_141_settings_and_waits_for_the_superlink():
    """docs/deploy.md: no deprecated `options.` connection fields; every --federation-config key is
    one the installed flwr accepts; a SuperLink started in a block is polled until it answers
    before any SuperNode or `flwr run` of that block (a `flwr run` sent too early fails, exit 0)."""
    import re

    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    blocks = _deploy_doc_blocks()
    assert not [ln for b in blocks for ln in b.splitlines() if ln.strip().startswith("options.")]
    settings = [m for b in blocks for m in re.findall(r'--federation-config "([^"]+)"', b)]
    assert settings
    for setting in settings:
        parsed = {k.replace("-", "_"): v for k, v in parse_config_args([setting]).items()}
        assert simulation_config_from_json(parsed).num_supernodes >= 1, setting  # unknown keys raise
    started = [b for b in blocks if re.search(r"^flower-superlink .*", b, re.M)]
    assert len(started) >= 3
    for block in started:
        lines = block.splitlines()
        link = next(i for i, ln in enumerate(lines) if ln.startswith("flower-superlink"))
        users = [i for i, ln in enumerate(lines) if ln.startswith(("flower-supernode", "flwr run"))]
        wait = next((i for i, ln in enumerate(lines) if i > link and ln.startswith("until ") and "/health" in block), None)
        assert wait is not None and all(wait < i for i in users), block


class Federation:
    """A SuperLink and SuperNodes on fresh loopback ports, with their own FLWR_HOME. With
    ``simulation``, a simulation SuperLink whose ``num_nodes`` virtual SuperNodes run on Ray."""

    def __init__(self, tmp: Path, num_nodes: int, tls: dict[str, Path] | None = None, auth: bool = False,
                 simulation: bool = False) -> None:
        self.tmp, self.tls, self.procs, self.logs = tmp, tls, [], []
        bin_dir = Path(sys.executable).parent
        flwr_home = tmp / "flwr-home"
        flwr_home.mkdir()
        self.env = {**os.environ, "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.flwr = str(bin_dir / "flwr")
        self.port = _free_port()
        secure = ["--ssl-ca-certfile", str(tls["ca"]), "--ssl-certfile", str(tls["cert"]), "--ssl-keyfile",
                  str(tls["key"])] if tls else ["--insecure"]
        link = [str(bin_dir / "flower-superlink"), *secure, "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation"]
        if auth:
            link.append("--enable-supernode-auth")
        conn = f'root-certificates = "{tls["ca"]}"' if tls else "insecure = true"
        self.run_args: list[str] = []
        if simulation:  # flwr 1.41's settings for `flwr run`, as docs/deploy.md gives them (not deprecated options.)
            link.append("--simulation")
            self.run_args = ["--federation-config", f"num-supernodes={num_nodes} client-resources-num-cpus=1 init-args-num-cpus=2"]
        (flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{self.port}"\n{conn}\n')
        self._start("superlink", link)
        self._wait_health()
        for i in range(0 if simulation else num_nodes):
            node = [str(bin_dir / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--port", str(_free_port()),
                    "--node-config", f"partition-id={i} num-partitions={num_nodes}", "--max-wait-time", "60"]
            node += ["--root-certificates", str(tls["ca"])] if tls else ["--insecure"]
            if auth:
                private, public = _node_keys(tmp, f"node{i}")
                self.cli("supernode", "register", str(public), "test", "--format", "json")
                node += ["--auth-supernode-private-key", str(private)]
            self._start(f"supernode{i}", node)
        if auth:  # a SuperNode whose key was never registered: the SuperLink must refuse it
            private, _ = _node_keys(tmp, "intruder")
            self._start("intruder", [str(bin_dir / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
                                     "--port", str(_free_port()), "--node-config", "partition-id=0 num-partitions=2",
                                     "--max-wait-time", "10", "--root-certificates", str(tls["ca"]),
                                     "--auth-supernode-private-key", str(private)])
            self.intruder = self.procs[-1]

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "w")
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.tmp))

    def _wait_health(self, timeout: float = 60.0) -> None:
        import ssl
        import urllib.request

        scheme = "https" if self.tls else "http"
        ctx = ssl.create_default_context(cafile=str(self.tls["ca"])) if self.tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.procs[0].poll() is None, (self.tmp / "superlink.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health", timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError("the SuperLink did not become healthy")

    def cli(self, *args: str) -> dict:
        out = subprocess.run([self.flwr, *args], capture_output=True, text=True, env=self.env, cwd=self.tmp, timeout=120)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return json.loads(out.stdout[out.stdout.index("{"):])

    def run_app(self, app_dir: Path, out: Path, timeout: float = 300.0) -> str:
        """``flwr run`` and wait until the ServerApp wrote the run's summary; the final status."""
        run_id = str(self.cli("run", str(app_dir), "test", *self.run_args, "--format", "json")["run-id"])
        deadline = time.monotonic() + timeout
        status = "running"
        while time.monotonic() < deadline:
            if (out / "summary.json").is_file() or not status.startswith("running") and status != "pending":
                break
            time.sleep(1.0)
            if int(time.monotonic()) % 10 == 0:
                status = self.cli("list", "test", "--run-id", run_id, "--format", "json")["runs"][0]["status"]
        for _ in range(30):  # the ServerApp writes the summary, then returns
            status = self.cli("list", "test", "--run-id", run_id, "--format", "json")["runs"][0]["status"]
            if status.startswith("finished"):
                break
            time.sleep(1.0)
        if status != "finished:completed":
            logs = subprocess.run([self.flwr, "log", run_id, "test", "--show"], capture_output=True, text=True,
                                  env=self.env, timeout=60)
            raise AssertionError(f"run {run_id}: {status}\n{logs.stdout[-4000:]}")
        return status

    def close(self) -> None:
        for p in reversed(self.procs):  # SuperNodes first
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()


needs_daemons = pytest.mark.skipif(shutil.which("flower-superlink", path=str(Path(sys.executable).parent)) is None,
                                   reason="flwr's daemons are not installed next to this Python")


def _deployed_run(tmp_path: Path, cfg: ExperimentConfig, *, tls: bool = False, auth: bool = False,
                  simulation: bool = False) -> dict:
    """``fednorm flower-app`` (the experiment travels inside the app), a federation, ``flwr run``."""
    from fednorm.cli.main import main

    cfg_path = tmp_path / "experiment.yaml"
    cfg_path.write_text(json.dumps(cfg.model_dump(mode="json")))  # JSON is YAML
    out = tmp_path / "run"
    app_dir = tmp_path / "app"
    assert main(["flower-app", str(app_dir), "--config", str(cfg_path), "--out", str(out), "--num-nodes", "2",
                 "--exchange-timeout", "120"]) == 0
    fed = Federation(tmp_path, 2, tls=_tls_files(tmp_path) if tls else None, auth=auth, simulation=simulation)
    try:
        fed.run_app(app_dir, out)
        if auth:
            assert fed.intruder.wait(timeout=60) != 0
            assert "Failed to activate SuperNode" in (tmp_path / "intruder.log").read_text()
    finally:
        fed.close()
    from fednorm.engine.outputs import read_metrics, read_summary

    summary = read_summary(out)
    assert summary["status"] == "completed" and summary["runtime"] == "Flower (2 SuperNodes)"
    return _metrics(read_metrics(out), summary)


@pytest.mark.slow
@needs_daemons
def test_flwr_run_on_a_simulation_superlink_gives_the_simulators_metrics(tmp_path):
    """The same app directory on Flower's simulation runtime (`flower-superlink --simulation`,
    Ray, 2 virtual SuperNodes whose node config holds partition-id / num-partitions)."""
    pytest.importorskip("ray")
    cfg = _config("hbn", eval_every=2)
    _close(_deployed_run(tmp_path, cfg, simulation=True), _reference(cfg), "flwr run --simulation")


@pytest.mark.slow
@needs_daemons
def test_deployment_with_tls_and_supernode_authentication_gives_the_simulators_metrics(tmp_path):
    """A SuperLink and two SuperNodes over TLS with SuperNode authentication (an unregistered
    node is refused). FedBN with an evaluation: 4 exchanges (train, train, evaluate, collect the
    local state). One federation for both properties: every exchange starts a `flwr-clientapp`
    process per node (importing torch), which makes each deployment test cost minutes; the
    insecure transport runs in the simulation-SuperLink test above."""
    cfg = _config("fedbn", eval_every=2)
    _close(_deployed_run(tmp_path, cfg, tls=True, auth=True), _reference(cfg), "tls+auth")
