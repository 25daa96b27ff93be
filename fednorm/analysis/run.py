"""``fednorm analyze RUN_DIR``: the LN paper's analyses of a finished run's global model.

Loads the run's ``config.yaml`` and latest checkpoint, rebuilds its data and model, and
writes ``analysis.json`` plus three plots into the run directory:

* ``analysis_norms.png`` — per class, mean raw feature norm and class-embedding norm ``||w_c||``,
  for the global model and after local training on a one-class client (Fig. 3 left);
* ``analysis_spectrum.png`` — normalised singular values of the features of ``per_class`` test
  images of every class (Fig. 3 right);
* ``analysis_overfitting.png`` — per-class test accuracy before and after ``steps`` local steps
  on that client, for the model as trained and for the same weights with FN toggled (Fig. 2).

For personalized methods (FedBN, SiloBN) the global state is analysed (its local tensors are
the server's copies, not any client's). A user's own module (``fednorm.analyze(run, model=net,
data=data)``) is analysed through its classifier (:func:`fednorm.nn.classifier_head`): its
features are that layer's input, and the FN-toggled variant is left out (it needs a fednorm
model's ``forward_features``/``head`` seam).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engine.outputs import json_safe
from ..engine.runlock import holding_run_lock
from .metrics import collapse_report, extract_features, local_overfitting, norm_report, sample_per_class, toggle_feature_norm

__all__ = ["analyze_run", "pick_one_class_client", "format_table"]


def pick_one_class_client(histogram: np.ndarray) -> int:
    """The client holding the fewest classes (ties: the largest, then the lowest id); must be non-empty."""
    hist = np.asarray(histogram)
    sizes = hist.sum(1)
    held = (hist > 0).sum(1)
    candidates = [c for c in range(len(hist)) if sizes[c] > 0]
    if not candidates:
        raise ValueError("every client is empty")
    return min(candidates, key=lambda c: (held[c], -sizes[c], c))



@holding_run_lock("analyze", "it is still training: analyze it once that run has finished")
def analyze_run(
    run_dir: str | Path,
    *,
    model: Any = None,
    data: Any = None,
    client: int | None = None,
    steps: int = 5,
    lr: float | None = None,
    per_class: int = 2,
    max_test: int = 2000,
    plots: bool = True,
    data_dir: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Analyse the final global model of a run directory; writes ``analysis.json`` (and plots).

    Args:
        run_dir: a ``fednorm run`` output directory (``config.yaml`` + ``checkpoint.pt``).
        model: a run of the user's own ``nn.Module`` (``fednorm.run(model=...)``) takes the same
            module (or factory) back; its weights come from the checkpoint.
        data: a run of the user's own data takes the same ``FederatedData`` back (checked against
            the run's recorded fingerprint).
        client: the client to train locally (default: the one with the fewest classes).
        steps: local SGD steps (default: 5, the paper's Fig. 2).
        lr: local learning rate (default: the run's ``lr``).
        per_class: test images per class in the feature matrix (default: 2, so 20×d on CIFAR-10).
        max_test: at most this many test images (stratified) for norms and accuracies.
        plots: write the PNG plots.
        data_dir: the dataset folder, if not the run's.
        device: torch device (default: the run's; the CPU for a GPU run where there is no GPU).

    Returns:
        The analysis (also written as JSON).
    """
    from ..engine.reload import simulation_from_run
    from ..errors import ConfigError

    run_dir = Path(run_dir)
    sim, _ = simulation_from_run(run_dir, model=model, data=data, data_dir=data_dir, device=device, what="analyze")
    cfg = sim.config
    net = sim.global_model()
    data = sim.data
    num_classes = data.num_classes
    hist = data.histogram()
    cid = pick_one_class_client(hist) if client is None else int(client)
    if not 0 <= cid < data.num_clients:
        raise ConfigError(f"client must be in [0, {data.num_clients}), got {cid}")
    if hist[cid].sum() == 0:
        raise ConfigError(f"client {cid} holds no training samples")
    per = max(1, max_test // num_classes)
    test_ix = torch.as_tensor(sample_per_class(data.test_y, per, seed=cfg.seed), device=data.test_y.device)
    x_test, y_test = data.test_x[test_ix], data.test_y[test_ix]
    feat_ix = torch.as_tensor(sample_per_class(data.test_y, per_class, seed=cfg.seed + 1), device=data.test_y.device)
    x_feat = data.test_x[feat_ix]
    ix = data.client_train[cid]
    x_client, y_client = data.train_x[ix], data.train_y[ix]
    local_lr = cfg.lr if lr is None else float(lr)
    has_fn = type(net).__name__ == "FeatureNormClassifier"

    def describe(net: torch.nn.Module) -> dict[str, Any]:
        return {
            "norms": norm_report(net, x_test, y_test, num_classes),
            "collapse": collapse_report(extract_features(net, x_feat, raw=False)),
            "collapse_raw": collapse_report(extract_features(net, x_feat, raw=True)),
        }

    variants = {"as_trained": net}
    if hasattr(net, "forward_features"):  # FN goes between a fednorm model's features and head; a user's module has no such seam
        variants["fn_removed" if has_fn else "fn_inserted"] = toggle_feature_norm(net)
    result: dict[str, Any] = {
        "run_dir": str(run_dir),
        "round": sim.server_round,
        "model": cfg.model,
        "norm": cfg.norm,
        "method": cfg.method,
        "feature_norm": has_fn,
        "client": cid,
        "client_classes": [int(c) for c in np.flatnonzero(hist[cid])],
        "client_size": int(hist[cid].sum()),
        "local_steps": steps,
        "local_lr": local_lr,
        "num_test": int(len(y_test)),
        "feature_matrix_rows": int(len(x_feat)),
        "global": describe(net),
        "local": {},
    }
    for name, variant in variants.items():
        over = local_overfitting(variant, x_client, y_client, x_test, y_test, num_classes, steps=steps, lr=local_lr, seed=cfg.seed)
        trained = over.pop("model")
        result["local"][name] = {**over, **describe(trained)}
    result = json_safe(result)
    (run_dir / "analysis.json").write_text(json.dumps(result, indent=2) + "\n")
    if plots:
        _plot(result, run_dir)
    sim.model.train()
    return result


def format_table(result: dict[str, Any]) -> str:
    """A short text summary of :func:`analyze_run`'s result."""
    lines = [
        f"{result['method']}+{result['norm']} ({result['model']}), round {result['round']}; local training on client "
        f"{result['client']} (classes {result['client_classes']}, {result['local_steps']} steps, lr {result['local_lr']:g})",
        f"{'model':<28}{'test acc':>9}{'client-class pred.':>20}{'mean ||h||':>12}{'mean ||w_c||':>14}{'eff. rank':>11}{'s1/s2':>9}",
    ]
    c0 = result["client_classes"][0]

    def row(label: str, acc: dict[str, Any], info: dict[str, Any]) -> str:
        fn = [v for v in info["norms"]["feature_norm"] if v is not None]
        w = info["norms"]["class_embedding_norm"]
        col = info["collapse"]
        ratio = col["sigma1_over_sigma2"]
        return (
            f"{label:<28}{100 * acc['accuracy']:>8.1f}%{100 * acc['prediction_fraction'][c0]:>19.1f}%"
            f"{np.mean(fn) if fn else float('nan'):>12.3g}{np.mean(w):>14.3g}{col['effective_rank']:>11.2f}"
            f"{(ratio if ratio is not None else float('inf')):>9.2f}"
        )

    first = next(iter(result["local"].values()))
    lines.append(row("global model", first["before"], result["global"]))
    for name, info in result["local"].items():
        lines.append(row(f"after local ({name})", info["after"], info))
    return "\n".join(lines)


def _plot(result: dict[str, Any], run_dir: Path) -> None:
    from ..plotting import _plt

    plt = _plt()
    classes = np.arange(len(result["global"]["norms"]["class_embedding_norm"]))
    title = f"{result['method']} + {result['norm']}, round {result['round']}; client {result['client']} {result['client_classes']}"

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = [("global", result["global"])] + [(f"after local ({k})", v) for k, v in result["local"].items()]
    width = 0.8 / len(panels)
    for i, (label, info) in enumerate(panels):
        fn = [np.nan if v is None else v for v in info["norms"]["feature_norm"]]
        axes[0].bar(classes + i * width, fn, width, label=label)
        axes[1].bar(classes + i * width, info["norms"]["class_embedding_norm"], width, label=label)
    axes[0].set_title("mean raw feature norm ||h(x)|| per class")
    axes[1].set_title("class-embedding norm ||w_c||")
    for ax in axes:
        ax.set_xlabel("class")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(run_dir / "analysis_norms.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, info in panels:
        sv = info["collapse"]["normalized_singular_values"]
        ax.plot(np.arange(1, len(sv) + 1), sv, marker=".", label=f"{label} (eff. rank {info['collapse']['effective_rank']:.1f})")
    ax.set_xlabel("index")
    ax.set_ylabel("σ_i / σ_1")
    ax.set_yscale("log")
    ax.set_title(f"feature spectrum ({result['feature_matrix_rows']} test images)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "analysis_spectrum.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    first = next(iter(result["local"].values()))
    bars = [("global", first["before"])] + [(f"after local ({k})", v["after"]) for k, v in result["local"].items()]
    width = 0.8 / len(bars)
    for i, (label, acc) in enumerate(bars):
        vals = [np.nan if v is None else 100 * v for v in acc["per_class_accuracy"]]
        ax.bar(classes + i * width, vals, width, label=f"{label} ({100 * acc['accuracy']:.1f}%)")
    ax.set_xlabel("class")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"local overfitting: {result['local_steps']} steps on client {result['client']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "analysis_overfitting.png", dpi=110)
    plt.close(fig)
