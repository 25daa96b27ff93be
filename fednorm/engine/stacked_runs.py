"""Several runs as one computation: their clients trained together in one stacked model per round.

A paper's table is many runs of one small model (seeds, partitions, table cells). The vectorized
executor already trains a round's clients as a tensor dimension; :func:`run_stacked` stacks the
runs' clients the same way: each round, the clients every run sampled are loaded into one stacked
model (each row with its own run's global weights and its own local state), trained in lockstep,
and their updates handed back to their runs. Everything else stays each run's own: its config,
data partition, client sampling, method and server state, state bank, evaluation, checkpoints,
signals and run directory, written exactly as a run made alone (each run is :func:`fednorm.run`
in a thread of its own; the threads meet at each round's training, :class:`RoundBarrier`).

Each stacked run equals the same run alone to float rounding (tested in float64): the rows draw
the batches and augmentation of their own run's seeded streams. What stacks (:func:`stack_blockers`):
runs of one method, model, norm and local schedule on one dataset, whose method has no client-side
hooks (FedAvg with any norm, FedBN, SiloBN, FedFN, ...) or hooks that read each row's run from the
context (HBN, FBN, FixBN: :attr:`~fednorm.methods.base.Method.stacks_across_runs`); each row
steps at its own run's learning rate (seeds, partitions and learning rates stack: a sweep is one
computation). Anything else runs each run's round on its own executor, with the reason said once.
Runs that stand at different rounds (one resumed beside new ones) train in one group per round. A round whose
joint training diverges is rerun run by run, so only the run that diverged stops.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..errors import DivergenceError
from ..methods.base import ClientUpdates, Method
from ..tracking.callback import Callback, as_callback
from .rng import derive_seed, torch_generator
from .simulator import Simulation
from .vectorized import VectorizedExecutor

__all__ = ["run_stacked", "stack_blockers", "RoundBarrier", "StackedRunsExecutor"]

#: Settings every stacked run must share: they shape the stacked model and the local steps.
SHARED_FIELDS = ("dataset", "dataset_args", "data_dir", "input_norm", "augment", "crop_fill", "model", "model_args", "norm", "norm_args",
                 "method", "method_args", "buffers", "affine", "client_opt", "client_opt_args", "batch_size", "local_epochs",
                 "local_steps", "drop_last", "momentum", "weight_decay", "max_grad_norm", "agc_clip", "dsgd", "dtype", "device",
                 "channels_last", "executor", "max_parallel_clients")


def stack_blockers(configs: Sequence[ExperimentConfig]) -> list[str]:
    """Why ``configs`` cannot run stacked (empty when they can); checked before any run starts."""
    from ..optim.compose import build_method

    reasons = []
    first = configs[0]
    for name in SHARED_FIELDS:
        values = {repr(getattr(c, name)) for c in configs}
        if len(values) > 1:
            reasons.append(f"the runs differ in {name}")
    if first.executor == "sequential":
        reasons.append("executor sequential was asked for")
    for bad, why in ((first.client_deadline is not None, "client_deadline times each client alone"),
                     (first.diagnostics is not None, "diagnostics read each run's clients"),
                     (first.dp_clip is not None, "client-level DP noises each run's updates")):
        if bad:
            reasons.append(why)
    method = build_method(first)
    hooks = [h for h in ("stacked_client_begin", "stacked_client_end", "stacked_client_loss", "stacked_client_gradient",
                         "client_begin", "client_end", "client_loss", "client_gradient")
             if getattr(type(method), h) is not getattr(Method, h)]
    if hooks and not type(method).stacks_across_runs:
        reasons.append(f"method '{first.method}'" + (f" with client_opt '{first.client_opt}'" if first.client_opt != "none" else "")
                       + f" has client-side hooks ({', '.join(hooks[:2])}) that act on one run's state")
    if method.requires_lockstep:
        reasons.append(f"method '{first.method}' synchronises BatchNorm across a run's clients")
    return reasons


class _RowBank:
    """The stacked executor's bank: row ``v`` of the union is client ``c`` of run ``r``, whose
    state lives in that run's own bank (so each run's checkpoint holds its clients)."""

    def __init__(self, owner: "StackedRunsExecutor") -> None:
        self.owner = owner

    def get(self, v: int) -> dict[str, torch.Tensor] | None:
        r, c = self.owner.locate(v)
        return self.owner.sims[r].bank.get(c)

    def put(self, v: int, state: dict[str, torch.Tensor]) -> None:
        r, c = self.owner.locate(v)
        self.owner.sims[r].bank.put(c, state)


class StackedRunsExecutor(VectorizedExecutor):
    """The vectorized executor over the union of several runs' clients (module docstring).

    Client ``c`` of run ``r`` is row ``offsets[r] + c`` of a virtual federation whose data are the
    runs' (shared) tensors with every run's client index sets one after the other.
    """

    def __init__(self, sims: Sequence[Simulation]) -> None:
        built = [sim for sim in sims if sim is not None]  # None: a run that failed before it was built
        base = built[0]
        for sim in built[1:]:
            same = sim.data.train_x is base.data.train_x or torch.equal(sim.data.train_x, base.data.train_x)
            if not (same and torch.equal(sim.data.train_y, base.data.train_y)):
                raise ValueError("the runs' training tensors differ: their datasets cannot be stacked")
        self.sims = list(sims)
        self.offsets = [0]
        for sim in sims:
            self.offsets.append(self.offsets[-1] + (sim.data.num_clients if sim is not None else 0))
        union = FederatedData(info=base.data.info, train_x=base.data.train_x, train_y=base.data.train_y,
                              test_x=base.data.test_x, test_y=base.data.test_y,
                              client_train=[ix for sim in built for ix in sim.data.client_train],
                              client_test=[ix for sim in built for ix in sim.data.client_test], augment=base.data.augment)
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        super().__init__(base.model, base.method, union, _RowBank(self), base.spec, base.config.seed,  # type: ignore[arg-type]
                         max_clients=base.config.max_parallel_clients * len(built))

    def locate(self, v: int) -> tuple[int, int]:
        """(run, client) of union row ``v``."""
        for r in range(len(self.sims)):
            if v < self.offsets[r + 1]:
                return r, v - self.offsets[r]
        raise IndexError(v)

    def client_local(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        r, c = self.locate(client_id)
        return self.sims[r].executor.client_local(c, self._states[r])

    def _context(self, server_round, client_ids, net, indices, global_state, locals_, lr):
        """The hooks see each row as its own run's client: its run-local id, seed and global state."""
        ctx = super()._context(server_round, client_ids, net, indices, global_state, locals_, lr)
        rows = [self.locate(v) for v in client_ids]
        ctx.client_ids = [c for _, c in rows]
        ctx.seeds = [self.sims[r].config.seed for r, _ in rows]
        ctx.global_states = [self._states[r] for r, _ in rows]
        return ctx

    def _generators(self, server_round: int, client_ids: list[int]) -> list[torch.Generator]:
        rows = [self.locate(v) for v in client_ids]
        return [torch_generator(self.sims[r].config.seed, "batches", server_round, c) for r, c in rows]

    def _module_seed(self, server_round: int, client_ids: list[int]) -> int:
        r, c = self.locate(client_ids[0])
        return derive_seed(self.sims[r].config.seed, "module-rng-vectorized", server_round, c)

    def _load_chunk(self, client_ids: list[int], global_state: dict[str, torch.Tensor]):
        net = self._stacked_model(len(client_ids))
        locals_ = [self.client_local(v, global_state) for v in client_ids]
        runs = [self.locate(v)[0] for v in client_ids]
        with torch.no_grad():
            for key, tensor in net.state_dict(keep_vars=True).items():
                if key in self.method.local_keys:
                    tensor.copy_(torch.stack([loc[key] for loc in locals_]))
                else:  # each row its own run's global tensor
                    tensor.copy_(torch.stack([self._states[r][key] for r in runs]))
        return net, locals_

    def train(self, server_round: int, requests: dict[int, list[int]], lr: float | dict[int, float]) -> dict[int, ClientUpdates]:
        """Train ``requests`` (run -> its clients) of one round together, at one learning rate or
        each run's own (``lr``: run -> rate); each run's updates, with its own client ids."""
        self._states = {r: self.sims[r].global_state for r in requests}
        union = [self.offsets[r] + c for r, clients in requests.items() for c in clients]
        rates = lr if isinstance(lr, (int, float)) else [lr[r] for r, clients in requests.items() for _ in clients]
        updates = self.run_round(server_round, union, self.sims[next(iter(requests))].global_state, rates)
        out: dict[int, ClientUpdates] = {}
        position = 0
        for r, clients in requests.items():
            part = updates.subset(list(range(position, position + len(clients))))
            part.client_ids = list(clients)
            position += len(clients)
            out[r] = part
        return out


@dataclass
class _Request:
    run: int
    server_round: int
    clients: list[int]
    lr: float
    result: Any = None
    error: BaseException | None = None
    done: bool = False


class RoundBarrier:
    """Where the runs' threads meet each round: when every run still going has asked for its
    round's training, the last to arrive trains them all (grouped by round; each row at its own
    run's learning rate) and wakes the others with their own updates."""

    def __init__(self, executor: StackedRunsExecutor, runs: Sequence[int]) -> None:
        self.executor = executor
        self.active = set(runs)
        self.pending: dict[int, _Request] = {}
        self.cond = threading.Condition()
        self.joint_rounds = 0
        self.separate_rounds = 0

    def leave(self, run: int) -> None:
        with self.cond:
            self.active.discard(run)
            self._maybe_run()
            self.cond.notify_all()

    def train(self, run: int, server_round: int, clients: list[int], lr: float) -> ClientUpdates:
        req = _Request(run, server_round, clients, lr)
        with self.cond:
            self.pending[run] = req
            self._maybe_run()
            self.cond.notify_all()
            while not req.done:
                self.cond.wait()
        if req.error is not None:
            raise req.error
        return req.result

    def _maybe_run(self) -> None:
        """Called with the lock held: run the pending requests once every active run has one."""
        if not self.pending or set(self.pending) < self.active:
            return
        batch, self.pending = dict(self.pending), {}
        groups: dict[int, list[_Request]] = {}
        for req in batch.values():
            groups.setdefault(req.server_round, []).append(req)
        for server_round, reqs in groups.items():
            try:
                results = self.executor.train(server_round, {q.run: q.clients for q in reqs}, {q.run: q.lr for q in reqs})
                for q in reqs:
                    q.result = results[q.run]
                self.joint_rounds += 1
            except DivergenceError:  # one run diverged: train each alone so only that run stops
                self.separate_rounds += 1
                for q in reqs:
                    sim = self.executor.sims[q.run]
                    try:
                        q.result = sim.executor.run_round(server_round, q.clients, sim.global_state, q.lr)
                    except BaseException as exc:  # noqa: BLE001 - handed to that run's thread
                        q.error = exc
            except BaseException as exc:  # noqa: BLE001 - every run of the group sees it
                for q in reqs:
                    q.error = exc
            for q in reqs:
                q.done = True


_BUILD_LOCK = threading.Lock()


class _Gate:
    """Where the runs wait, once built, for the driver to make the stacked executor from them; a
    run that fails before it is built still arrives, so the others are not held up."""

    def __init__(self, runs: int) -> None:
        self.runs, self.arrived, self.open = runs, 0, False
        self.cond = threading.Condition()

    def arrive(self) -> None:
        with self.cond:
            self.arrived += 1
            self.cond.notify_all()

    def wait_all(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.arrived >= self.runs)

    def release(self) -> None:
        with self.cond:
            self.open = True
            self.cond.notify_all()

    def wait_open(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.open)


def _stacking_factory(barrier_box: list[RoundBarrier | None], index: int, made: list[Simulation | None],
                      gate: _Gate) -> Callable[..., Simulation]:
    """The ``simulation=`` factory of run ``index``: a Simulation whose clients train at the barrier
    (or on its own executor when the runs could not be stacked after all)."""

    class StackedSimulation(Simulation):
        def __init__(self, config: ExperimentConfig, data: FederatedData | None = None) -> None:
            with _BUILD_LOCK:  # a model is initialised from the global RNG, seeded per run: one run at a time
                super().__init__(config, data)
            made[index] = self
            gate.arrive()
            gate.wait_open()  # every run built: the driver has made the stacked executor from them

        def train_clients(self, server_round: int, client_ids: list[int], lr: float) -> ClientUpdates:
            from ..nn.comm import CommTraffic

            barrier = barrier_box[0]
            if barrier is None:  # the runs' models or data did not stack: each trains alone
                return super().train_clients(server_round, client_ids, lr)
            updates = barrier.train(index, server_round, client_ids, lr)
            # the samples its clients trained: the batch plans' sizes (the draw picks which, not how many)
            ex = self.executor
            self._last_samples_seen = sum(sum(len(b) for b in ex._batch_plan(len(self.data.client_train[c]), torch.Generator()))
                                          for c in client_ids)
            self._last_traffic = CommTraffic()
            return updates

    return StackedSimulation


def run_stacked(configs: Sequence[ExperimentConfig], *, resume: Sequence[str | Path | None] | None = None,
                data: Sequence[FederatedData | None] | None = None, progress: bool | None = False,
                on_round: Callable[[Any, Simulation], None] | None = None,
                **run_kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Run ``configs`` stacked (each with its own run directory, as :func:`fednorm.run` writes it).

    ``resume``: per run, a run directory to continue instead (its config must be the run's).
    ``data``: per run, its client data already built (as :func:`fednorm.run`'s ``data``).
    Returns each run's :class:`~fednorm.api.RunResult` (or the exception that ended it) and how
    the rounds ran (``joint_rounds``, ``separate_rounds``, ``blockers``). Runs that cannot stack
    (:func:`stack_blockers`) run one after another, and ``blockers`` says why.
    """
    from .. import api

    configs = list(configs)
    resume = list(resume) if resume is not None else [None] * len(configs)
    given = list(data) if data is not None else [None] * len(configs)

    def one(i: int, **kw: Any) -> Any:
        if resume[i] is not None:
            # the plan's schedule and evaluation cadence (a longer plan extends a finished run)
            return api.run(resume=resume[i], data=given[i], progress=progress, rounds=configs[i].rounds,
                           eval_every=configs[i].eval_every, eval_last_rounds=configs[i].eval_last_rounds, **kw, **run_kwargs)
        return api.run(configs[i], data=given[i], progress=progress, **kw, **run_kwargs)

    blockers = stack_blockers(configs) if len(configs) > 1 else ["one run"]
    if blockers:
        results: list[Any] = []
        for i in range(len(configs)):
            try:
                results.append(one(i, on_round=on_round))
            except BaseException as exc:  # noqa: BLE001
                results.append(exc)
        return results, {"joint_rounds": 0, "separate_rounds": 0, "blockers": blockers}
    from ..nn.stacked import NotStackableError

    n = len(configs)
    made: list[Simulation | None] = [None] * n
    barrier_box: list[RoundBarrier | None] = [None]
    gate = _Gate(n)
    results: list[Any] = [None] * n
    lock = threading.Lock()
    unstacked: list[str] = []

    def body(i: int) -> None:
        try:
            results[i] = one(i, simulation=_stacking_factory(barrier_box, i, made, gate),
                             on_round=_Locked(as_callback(on_round), lock) if on_round else None)
        except BaseException as exc:  # noqa: BLE001 - reported per run
            results[i] = exc
            if made[i] is None:  # failed before its simulation was built: the others go on without it
                gate.arrive()
        finally:
            if barrier_box[0] is not None:
                barrier_box[0].leave(i)

    threads = [threading.Thread(target=body, args=(i,), name=f"fednorm-run-{i}") for i in range(n)]
    with _StopFile():  # a SIGINT/SIGTERM here stops every run after its round, with a checkpoint
        for t in threads:
            t.start()
        gate.wait_all()
        built = [i for i in range(n) if made[i] is not None]
        try:
            if len(built) > 1:
                barrier_box[0] = RoundBarrier(StackedRunsExecutor(made), built)
        except (NotStackableError, ValueError) as exc:  # e.g. a model the stacked executor cannot hold
            unstacked.append(f"the runs do not stack: {exc}")
        finally:
            gate.release()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)  # wakes for signals
    barrier = barrier_box[0]
    return results, {"joint_rounds": barrier.joint_rounds if barrier else 0,
                     "separate_rounds": barrier.separate_rounds if barrier else 0, "blockers": unstacked}


class _StopFile:
    """The runs' stop request: each run's thread reads the stop file of ``FEDNORM_STOP_FILE`` after
    every round (``fednorm.api.stop.StopRequest``); signals reach only the main thread, which
    writes it. A second signal stops every run at once."""

    def __enter__(self) -> "_StopFile":
        import os
        import signal
        import tempfile

        from ..api import STOP_FILE_ENV

        self._env = os.environ.get(STOP_FILE_ENV)
        if self._env:  # a launcher or a suite already asks through its own file
            self._previous: dict[int, Any] = {}
            return self
        self._dir = tempfile.mkdtemp(prefix="fednorm-stop-")
        self.path = os.path.join(self._dir, "stop")
        os.environ[STOP_FILE_ENV] = self.path
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import os

        if os.path.exists(self.path):
            raise KeyboardInterrupt
        with open(self.path, "w") as f:
            f.write(str(signum))

    def __exit__(self, *exc: Any) -> None:
        import os
        import shutil
        import signal

        from ..api import STOP_FILE_ENV

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if not self._env:
            os.environ.pop(STOP_FILE_ENV, None)
            shutil.rmtree(self._dir, ignore_errors=True)


class _Locked(Callback):
    """A callback shared by the runs' threads (a progress bar, a logger), one hook at a time."""

    def __init__(self, inner: Callback, lock: threading.Lock) -> None:
        self.inner, self.lock = inner, lock

    def on_run_start(self, sim: Any, run_dir: Any) -> None:
        with self.lock:
            self.inner.on_run_start(sim, run_dir)

    def __call__(self, record: Any, sim: Any) -> None:
        with self.lock:
            self.inner(record, sim)

    def on_run_end(self, sim: Any, summary: Any, run_dir: Any) -> None:
        with self.lock:
            self.inner.on_run_end(sim, summary, run_dir)
