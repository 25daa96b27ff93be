"""The command line the papers' toy analyses share (``python -m fednorm.analysis.<name>_toy``): the
seeds, the record written three ways (``<name>.json`` with the command that made it, ``<name>.md``
and a figure) and the table printed. Each toy keeps what is its own: its options, its table and
its plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["toy_parser", "write_toy_records"]


def toy_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser every toy starts from: ``--out``, ``--seeds`` and ``--no-plot``."""
    parser = argparse.ArgumentParser(prog=f"python -m fednorm.analysis.{name}", description=(doc or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {name}.json, {name}.md and {name}.png")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default: 3)")
    parser.add_argument("--no-plot", action="store_true")
    return parser


def write_toy_records(name: str, out: Path, table: dict[str, Any], markdown: Callable[[dict[str, Any]], str],
                      plot: Callable[[Path], Any] | None, argv: Sequence[str] | None) -> int:
    """Record ``table`` (with the command that made it) in ``out/<name>.json`` and ``.md``, draw the
    figure with ``plot`` (None: no figure) and print the markdown."""
    table["command"] = f"python -m fednorm.analysis.{name} " + " ".join(argv if argv is not None else sys.argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table)
    (out / f"{name}.md").write_text(text)
    if plot is not None:
        plot(out / f"{name}.png")
    print(text, end="")
    return 0
