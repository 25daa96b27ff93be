"""MLflow tracking (``--log mlflow``): the config as parameters, the metrics of every round, the
summary, and the run directory as artifacts at the end (checkpoints left out unless
``artifacts: all``).

The tracking store is ``log_args: {mlflow: {tracking_uri: ...}}``, else ``$MLFLOW_TRACKING_URI``,
else MLflow's default (``sqlite:///mlflow.db`` in the working directory): a local database, a
``file:`` folder (MLflow asks for ``MLFLOW_ALLOW_FILE_STORE=true`` for those) or a server's
``http(s)://`` address. Uses :class:`mlflow.tracking.MlflowClient`, never MLflow's global active
run, so several runs in one process do not mix. Needs ``pip install 'fednorm[mlflow]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .callback import Callback
from .values import client_scalars, flat_params, require, round_scalars, summary_scalars

__all__ = ["MlflowLogger"]

_STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}
ID_FILE = ".mlflow_run_id"  # in the run directory, so a resumed run continues its MLflow run


class MlflowLogger(Callback):
    """Args:
        tracking_uri: the tracking store or server (default: MLflow's).
        experiment: the MLflow experiment (default: ``fednorm``).
        run_name: the MLflow run's name (default: the run directory's name).
        artifacts: ``"run"`` (the run directory without checkpoints, default), ``"all"`` or ``"none"``.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "fednorm", run_name: str | None = None,
                 artifacts: str = "run") -> None:
        require("mlflow", "mlflow", "mlflow")
        if artifacts not in ("run", "all", "none"):
            raise ConfigError(f"log_args.mlflow.artifacts must be run, all or none, got {artifacts!r}")
        self.tracking_uri, self.experiment, self.run_name, self.artifacts = tracking_uri, experiment, run_name, artifacts
        self.client: Any = None
        self.run_id: str | None = None

    def on_run_start(self, sim: Any, run_dir: Path | None) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            self.client = MlflowClient(self.tracking_uri)
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
            earlier = run_dir / ID_FILE if run_dir is not None else None
            if earlier is not None and earlier.is_file():  # a resumed run continues its MLflow run
                self.run_id = earlier.read_text().strip()
                self.client.update_run(self.run_id, status="RUNNING")
                return
            name = self.run_name or (run_dir.name if run_dir is not None else None)
            run = self.client.create_run(exp_id, run_name=name, tags={"fednorm.run_dir": str(run_dir or "")})
        except MlflowException as exc:
            raise ConfigError(f"--log mlflow: {exc.message}") from None
        self.run_id = run.info.run_id
        if earlier is not None:
            earlier.parent.mkdir(parents=True, exist_ok=True)
            earlier.write_text(self.run_id + "\n")
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in flat_params(sim.config).items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _log(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def on_round_end(self, record: Any, sim: Any) -> None:
        values = round_scalars(record)
        if record.metrics:
            values.update({k.replace("/", "."): v for k, v in client_scalars(record).items()})
        self._log(values, record.server_round)

    def on_run_end(self, sim: Any, summary: dict[str, Any], run_dir: Path | None) -> None:
        if self.run_id is None:
            return
        self._log({f"summary.{k}": v for k, v in summary_scalars(summary).items()}, sim.server_round)
        if run_dir is not None and self.artifacts != "none":
            self._upload(Path(run_dir))
        self.client.set_terminated(self.run_id, status=_STATUS.get(summary.get("status"), "FAILED"))

    def _upload(self, run_dir: Path) -> None:
        for path in sorted(run_dir.rglob("*")):
            if not path.is_file() or path.name == ID_FILE or path.name.startswith("."):
                continue
            if self.artifacts == "run" and path.suffix == ".pt" and path.name.startswith("checkpoint"):
                continue
            rel = path.parent.relative_to(run_dir)
            if rel.parts[:1] == ("wandb",):  # W&B's own offline folder, still being written
                continue
            self.client.log_artifact(self.run_id, str(path), artifact_path=None if str(rel) == "." else str(rel))
