"""The tools on a finished run, from Python: :func:`evaluate`, :func:`diagnose` and :func:`analyze`.

They are ``fednorm evaluate``, ``fednorm diagnose`` and ``fednorm analyze`` for any run, and the
only route for a run of your own model or data (``fednorm.run(model=net, data=data)``): no
command can rebuild a module or tensors from a ``config.yaml``, so you give them back, as a resume
does. The module's architecture and the data's content fingerprint are checked against what the
run recorded; the weights come from the run's latest checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..data.federated import FederatedData

__all__ = ["evaluate", "diagnose", "analyze"]


def evaluate(
    run_dir: str | Path,
    *,
    model: Any = None,
    data: FederatedData | None = None,
    test_file: str | Path | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Score a run's latest checkpoint as the run scores it: on its own test data, or on another
    test set (``fednorm evaluate RUN_DIR --test-file F``).

    Args:
        run_dir: a run directory (``config.yaml`` + a checkpoint).
        model: the ``nn.Module`` (or factory) of a run of your own model, as given to
            :func:`fednorm.run`; its weights come from the checkpoint (default: None, a registry
            model rebuilt from the config).
        data: the :class:`~fednorm.FederatedData` of a run of your own data (default: None, built
            from the config).
        test_file: an ``.npz`` (uint8 ``x`` N×H×W×C, labels ``y``) to score the global model on,
            normalised as the run's inputs; writes ``RUN_DIR/evaluation.json`` when ``write``
            (default: None, the run's own test data; nothing is written).
        data_dir: the dataset folder, if not the run's.
        device: torch device (default: the run's; the CPU for a GPU run where there is no GPU).
        write: with ``test_file``, add its entry to ``RUN_DIR/evaluation.json`` (default: True).

    Returns:
        Without ``test_file``: ``round``, ``test_accuracy``, ``test_loss``,
        ``mean_client_accuracy`` and ``client_accuracies``, computed exactly as the run computed
        its last evaluation (each client with its own model under FedBN), so they equal the run's
        last recorded figures. With ``test_file``: ``round``, ``n``, ``correct``, ``accuracy``,
        ``loss``, ``interval95`` (Wilson) and ``own_test_accuracy``.

    Raises:
        ConfigError: ``run_dir`` holds no run; a run of your own model or data without them, or
            with other ones than it trained; ``test_file`` under a personalized method (FedBN has
            no one global model).
        DatasetError: a ``test_file`` that is not such an ``.npz`` or has other image sizes.

    Example:
        >>> import torch, fednorm
        >>> from torch import nn
        >>> g = torch.Generator().manual_seed(0)
        >>> clients = [(torch.randn(16, 4, generator=g), torch.arange(16) % 2) for _ in range(2)]
        >>> data = fednorm.FederatedData.from_tensors(clients, test=(torch.randn(8, 4, generator=g), torch.arange(8) % 2))
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> result = fednorm.run(model=net, data=data, rounds=2, out="runs/own", progress=False)
        >>> scores = fednorm.evaluate("runs/own", model=net, data=data)
        >>> scores["test_accuracy"] == result.summary["final_test_accuracy"]
        True
    """
    from ..evaluation import evaluate_run, evaluate_run_on

    if test_file is None:
        return evaluate_run(run_dir, model=model, data=data, data_dir=data_dir, device=device)
    return evaluate_run_on(run_dir, test_file, model=model, data=data, data_dir=data_dir, write=write)


def diagnose(
    run_dir: str | Path,
    *,
    model: Any = None,
    data: FederatedData | None = None,
    resample: int = 0,
    max_samples: int | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    write: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate a run's latest weights under each statistics it could use: is its accuracy lost in
    its weights or in its normalisation statistics (``fednorm diagnose``, docs/diagnostics.md)?

    Args:
        run_dir: a run directory.
        model: the module (or factory) of a run of your own model (default: None).
        data: the :class:`~fednorm.FederatedData` of a run of your own data (default: None).
        resample: for methods that re-estimate statistics from sampled clients (HBN), repeat that
            with this many other seeded samples (default: 0).
        max_samples: the exact statistics from a seeded share of this many training samples
            (default: all of them).
        data_dir: the dataset folder, if not the run's.
        device: torch device (default: the run's; the CPU for a GPU run where there is no GPU).
        write: write ``RUN_DIR/diagnosis.json`` (default: True).
        progress: called with a line per stage.

    Returns:
        ``round``, ``method``, ``norm``, ``accuracy`` (``as_evaluated``: the run's own last
        figure; ``deployed``, ``global_buffers`` and ``exact`` where the method has global
        statistics), ``layers`` (per normalisation layer: the statistics mismatch),
        ``hbn_batch_weight``, ``local_spread``, ``resampled`` and ``seconds``
        (``fednorm.diagnostics.diagnose_run``).

    Raises:
        ConfigError: as :func:`evaluate`; a checkpoint from before the first round.

    Example:
        Continuing :func:`evaluate`'s example:

        >>> report = fednorm.diagnose("runs/own", model=net, data=data, write=False)
        >>> report["accuracy"]["as_evaluated"] == result.summary["final_test_accuracy"]
        True
    """
    from ..diagnostics.offline import diagnose_run

    return diagnose_run(run_dir, model=model, data=data, resample=resample, max_samples=max_samples, data_dir=data_dir,
                        device=device, write=write, progress=progress)


def analyze(
    run_dir: str | Path,
    *,
    model: Any = None,
    data: FederatedData | None = None,
    client: int | None = None,
    steps: int = 5,
    lr: float | None = None,
    per_class: int = 2,
    max_test: int = 2000,
    plots: bool = True,
    data_dir: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """The LN paper's analyses of a run's final global model (``fednorm analyze``): feature and
    class-embedding norms, feature collapse, and local overfitting on a one-class client (LN
    paper Figs. 2-3). Writes ``RUN_DIR/analysis.json`` and, with ``plots``, ``analysis_*.png``.

    Args:
        run_dir: a run directory.
        model: the module (or factory) of a run of your own model (default: None).
        data: the :class:`~fednorm.FederatedData` of a run of your own data (default: None).
        client: the client to train locally (default: the one with the fewest classes).
        steps: local SGD steps (default: 5, the paper's Fig. 2).
        lr: local learning rate (default: the run's ``lr``).
        per_class: test samples per class in the feature matrix (default: 2).
        max_test: at most this many test samples (stratified) for norms and accuracies (default: 2000).
        plots: write the PNG plots (default: True).
        data_dir: the dataset folder, if not the run's.
        device: torch device (default: the run's; the CPU for a GPU run where there is no GPU).

    Returns:
        ``round``, ``method``, ``client``, ``global`` (norms and collapse of the global model) and
        ``local`` (per variant, as trained and with FN toggled: accuracy ``before`` and ``after``
        the local steps, with norms and collapse) (``fednorm.analysis.analyze_run``).

    Raises:
        ConfigError: as :func:`evaluate`; a ``client`` out of range or without training data.

    Example:
        Continuing :func:`evaluate`'s example:

        >>> figures = fednorm.analyze("runs/own", model=net, data=data, plots=False)
        >>> figures["round"]
        2
    """
    from ..analysis import analyze_run

    return analyze_run(run_dir, model=model, data=data, client=client, steps=steps, lr=lr, per_class=per_class,
                       max_test=max_test, plots=plots, data_dir=data_dir, device=device)
