"""The guides' examples run as written: docs/layers.md (fednorm's layers in your own loop) and
docs/extending.md (your own method).

How a guide runs (the convention its readers are told too):

* its ```python blocks run in order in one namespace, as one script, so a later block uses what
  an earlier one defined; the working directory is a fresh temporary folder, also on sys.path;
* a ```python block whose first line is ``# file: NAME`` is a file the guide asks the reader to
  save: it is written to NAME in that folder instead of being run;
* each line of a ```bash block that starts with ``python `` or ``fednorm `` runs there as a
  subprocess (one thread; ``fednorm`` as ``python -m fednorm``) and must exit 0; other blocks
  (```text, other commands) are shown, not run.

The checks are the ``assert`` statements inside the blocks (exact identities in float64, runs
that must learn, the method's shared/local split); tracebacks point at the guide's own lines.
Methods a guide registers are unregistered afterwards, so the rest of the suite sees the
built-in registry.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def blocks(path: Path) -> Iterator[tuple[str, int, str]]:
    """``(language, first line of the code, code)`` of every fenced block of ``path``."""
    text = path.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(2)) + 1
        yield match.group(1), line, match.group(2)


def run_guide(path: Path, workdir: Path) -> int:
    """Run the guide's blocks by the convention above; returns how many code blocks ran."""
    namespace: dict[str, object] = {"__name__": f"guide_{path.stem}"}
    ran = 0
    for language, line, code in blocks(path):
        if language == "python":
            first = code.split("\n", 1)[0]
            if first.startswith("# file: "):
                (workdir / first[len("# file: "):].strip()).write_text(code, encoding="utf-8")
                continue
            exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)  # noqa: S102 - the guide is ours
            ran += 1
        elif language == "bash":
            for command in code.splitlines():
                if not command.startswith(("python ", "fednorm ")):
                    continue
                env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(workdir), str(ROOT)])}
                env.pop("FEDNORM_PLUGINS", None)
                words = command.split("#", 1)[0].split()
                args = [sys.executable, *(words[1:] if words[0] == "python" else ["-m", "fednorm", *words[1:]])]
                proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
                assert proc.returncode == 0, f"{path.name}:{line}: `{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
                ran += 1
    return ran


@pytest.fixture
def guide_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory on sys.path; the method registry and torch's global random
    state (the guides seed it) are restored afterwards."""
    import torch

    from fednorm.methods import METHODS

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before_modules = set(sys.modules)
    registered = dict(METHODS._entries)  # the Registry has no public way to unregister
    rng = torch.random.get_rng_state()
    try:
        yield tmp_path
    finally:
        torch.random.set_rng_state(rng)
        METHODS._entries.clear()
        METHODS._entries.update(registered)
        for name in set(sys.modules) - before_modules:  # the guide's own modules (my_methods, ...)
            if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in str(sys.modules[name].__file__):
                del sys.modules[name]


@pytest.mark.parametrize("guide", ["layers.md", "extending.md"])
def test_guide_examples_run(guide: str, guide_dir: Path) -> None:
    path = ROOT / "docs" / guide
    ran = run_guide(path, guide_dir)
    assert ran >= 4, f"{guide}: only {ran} code blocks ran; were the fences renamed?"


def test_block_extraction_keeps_line_numbers(tmp_path: Path) -> None:
    """A failing block reports the guide's own line, so a broken example is found at once."""
    guide = tmp_path / "g.md"
    guide.write_text("# t\n\n```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError) as info:
        run_guide(guide, tmp_path)
    assert info.traceback[-1].lineno + 1 == 10 and Path(info.traceback[-1].path) == guide
