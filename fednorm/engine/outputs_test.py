"""Run directory names: readable, unique, and valid folder names on every system."""

from __future__ import annotations

from pathlib import Path

from fednorm.config import ExperimentConfig
from fednorm.engine.outputs import default_run_dir


def test_default_run_dir_of_your_own_data_has_no_colon_and_does_not_reuse_a_folder(tmp_path: Path) -> None:
    cfg = ExperimentConfig(dataset="user:tensors", model="user:cnn", method="fedbn")
    first = default_run_dir(cfg, tmp_path)
    assert ":" not in first.name and first.name.startswith("fedbn-bn-user-tensors-")
    first.mkdir()
    second = default_run_dir(cfg, tmp_path)
    assert second != first and second.name.startswith(first.name)
