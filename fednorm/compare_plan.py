"""A comparison's plan on disk, so that an interrupted ``fednorm compare`` can be continued.

``fednorm compare`` writes ``OUT/compare.json`` (its base config and variants) before the first
variant trains. ``fednorm compare --resume OUT`` (``fednorm.compare(resume=OUT)``) reads it back:
finished variants are kept, the interrupted one resumes from its checkpoint, the rest run, and
the table equals an uninterrupted comparison's (a resume is bit-exact).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .config import ExperimentConfig, load_config
from .errors import ConfigError

__all__ = ["PLAN_NAME", "save_plan", "load_plan"]

PLAN_NAME = "compare.json"


def save_plan(root: Path, base: ExperimentConfig, variants: Sequence[Mapping[str, Any]]) -> None:
    """Write ``root/compare.json`` atomically (a kill mid-write leaves the old one or none)."""
    root.mkdir(parents=True, exist_ok=True)
    payload = {"base": base.model_dump(mode="json"), "variants": [dict(v) for v in variants]}
    tmp = root / f".{PLAN_NAME}.tmp"
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, root / PLAN_NAME)


def load_plan(root: str | Path) -> tuple[ExperimentConfig, list[dict[str, Any]]]:
    """The base config and variants of the comparison in ``root``."""
    path = Path(root) / PLAN_NAME
    if not path.is_file():
        hint = ("it holds a comparison made before fednorm wrote compare.json: rerun the same command with --overwrite"
                if (Path(root) / "results.md").exists() else "is it a fednorm compare --out directory?")
        raise ConfigError(f"cannot resume {root}: no {PLAN_NAME} there ({hint})")
    try:
        payload = json.loads(path.read_text())
        base = load_config(None, payload["base"])
        variants = [dict(v) for v in payload["variants"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot resume {root}: {PLAN_NAME} is unreadable ({type(exc).__name__}: {exc})") from None
    return base, variants
