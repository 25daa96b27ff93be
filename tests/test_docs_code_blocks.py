"""Every code block of README.md and docs/*.md runs as written, or says why it cannot (issue 47.5).

What counts, per fenced block's language:

* ``python``: the blocks of a page run in order in one namespace, in a fresh folder (on
  ``sys.path``), at a tiny scale: ``rounds=N`` becomes ``rounds=1``. A block whose first line is
  ``# file: NAME`` is written to NAME instead (a file the page asks you to save).
* ``bash``/``sh``/``console``: every ``fednorm ...`` command (``$`` prompts, ``\\`` continuations
  and trailing comments handled) parses with the CLI's own argparse parser.
* ``yaml``/``toml``: parses.
* ``text``, an empty language, MyST directives (``{toctree}``): output or layout shown, not code.

A block preceded by ``<!-- fragment: REASON -->`` is not run (a placeholder for your tensors, a
run of data the suite has not); the reason must be given. Pages run by a test of their own are
listed in :data:`RUN_ELSEWHERE` with that test, and pages this module cannot yet mark (other work
is rewriting them) in :data:`NOT_RUN_HERE` with the reason. The Flower app of docs/deploy.md runs
two rounds on two in-process nodes.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
FRAGMENT = re.compile(r"<!--\s*fragment:(.*?)-->\s*$", re.DOTALL)

#: (page, first line of a block's code, or None for every python block of the page) -> the test that runs it
RUN_ELSEWHERE: dict[tuple[str, int | None], str] = {
    ("docs/layers.md", None): "tests/test_docs_guides.py",
    ("docs/extending.md", None): "tests/test_docs_guides.py",
}
#: README's "Use it from Python" block: tests/test_readme_python.py runs it (10 rounds, its figures checked)
README_EXAMPLE_TEST = "tests/test_readme_python.py"
#: (page, block's first code line) -> why this module does not run it yet
NOT_RUN_HERE: dict[tuple[str, str], str] = {}


@dataclass
class Block:
    page: str
    line: int  # of the code's first line
    language: str
    code: str
    fragment: str | None  # the reason, for a block marked a fragment

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> Iterator[Block]:
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(ROOT).as_posix()
    for match in FENCE.finditer(text):
        info = match.group(1).strip()
        before = text[: match.start()].rstrip()
        marked = FRAGMENT.search(before[-400:])
        reason = marked.group(1).strip() if marked and before.endswith("-->") else None
        yield Block(page, text.count("\n", 0, match.start(2)) + 1, info.split()[0] if info else "", match.group(2), reason)


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in blocks(p)]


def test_every_fragment_says_why():
    for b in all_blocks():
        if b.fragment is not None:
            assert len(b.fragment) > 10, f"{b.where}: a fragment marker must give its reason"


# -- shell blocks -------------------------------------------------------------------------------------

def fednorm_commands(code: str) -> Iterator[list[str]]:
    """The argument lists of the ``fednorm ...`` / ``python -m fednorm ...`` commands in a shell block."""
    joined = re.sub(r"\\\n\s*", " ", code)
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ").strip()
        for part in re.split(r"\s*(?:&&|;)\s*", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # ENV=value fednorm ...
                words = words[1:]
            # `...` elides options, `[--nnm true]` is an optional one: parse the command with it
            words = [w.removeprefix("[").removesuffix("]") for w in words if w not in ("...", "…")]
            if words[:1] == ["fednorm"]:
                yield words[1:]
            elif words[:3] == ["python", "-m", "fednorm"]:
                yield words[3:]


SHELL = [b for b in all_blocks() if b.language in ("bash", "sh", "shell", "console") and b.fragment is None]


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_shell_blocks_fednorm_commands_parse(block: Block, capsys):
    from fednorm.cli.main import build_parser

    for argv in fednorm_commands(block.code):
        if any(w in ("-h", "--help") for w in argv):
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block.where}: `fednorm {' '.join(argv)}` does not parse: {capsys.readouterr().err.strip()} ({exc.code})")


def test_the_shell_blocks_hold_fednorm_commands():
    assert sum(len(list(fednorm_commands(b.code))) for b in SHELL) >= 30


# -- yaml, toml -------------------------------------------------------------------------------------

CONFIG_FILES = [b for b in all_blocks() if b.language in ("yaml", "yml", "toml") and b.fragment is None]


@pytest.mark.parametrize("block", CONFIG_FILES, ids=[b.where for b in CONFIG_FILES])
def test_config_blocks_parse(block: Block):
    if block.language == "toml":
        tomllib.loads(block.code)
    else:
        yaml.safe_load(block.code)


# -- python blocks ----------------------------------------------------------------------------------

def python_blocks(page: str) -> list[Block]:
    return [b for b in all_blocks() if b.page == page and b.language == "python"]


def _skipped(b: Block) -> str | None:
    """Why ``b`` does not run here, or None."""
    if b.fragment is not None:
        return f"fragment: {b.fragment}"
    if (b.page, None) in RUN_ELSEWHERE:
        return f"runs in {RUN_ELSEWHERE[(b.page, None)]}"
    if b.page == "README.md" and "fednorm.FederatedData.from_tensors(clients)" in b.code:
        return f"runs in {README_EXAMPLE_TEST}"
    first = b.code.strip().splitlines()[0]
    return NOT_RUN_HERE.get((b.page, first))


PYTHON_PAGES = sorted({b.page for b in all_blocks() if b.language == "python"})


def tiny(code: str) -> str:
    """The block at a tiny scale: one round wherever it asks for several."""
    return re.sub(r"\brounds=\d+", "rounds=1", code)


@pytest.fixture
def page_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rng = torch.random.get_rng_state()
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        torch.random.set_rng_state(rng)
        for name in set(sys.modules) - before:  # the page's own files (task, server_app, ...)
            if str(tmp_path) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_run(page: str, page_dir: Path):
    namespace: dict[str, object] = {"__name__": f"page_{Path(page).stem}"}
    ran = 0
    for b in python_blocks(page):
        if _skipped(b):
            continue
        first = b.code.split("\n", 1)[0]
        if first.startswith("# file: "):
            (page_dir / first[len("# file: "):].strip()).write_text(b.code, encoding="utf-8")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a tiny run's batch-size warnings are not the page's point
            exec(compile("\n" * (b.line - 1) + tiny(b.code), str(ROOT / page), "exec"), namespace)  # noqa: S102 - our docs
        ran += 1
    if page == "docs/deploy.md":
        run_flower_app(page_dir)
        ran += 1
    skipped = [f"{b.where}: {_skipped(b)}" for b in python_blocks(page) if _skipped(b)]
    if not ran:
        assert skipped, f"{page}: no python block ran"
        pytest.skip("; ".join(skipped))


def test_each_python_block_runs_somewhere_or_says_why():
    """A block that runs nowhere has a reason on the page (a fragment) or here."""
    counted = 0
    for page in PYTHON_PAGES:
        for b in python_blocks(page):
            reason = _skipped(b)
            assert reason is None or len(reason) > 12, f"{b.where}: {reason}"
            counted += 1
    assert counted >= 20


# -- the Flower app of docs/deploy.md ---------------------------------------------------------------

def run_flower_app(folder: Path) -> None:
    """docs/deploy.md's server_app.py and client_app.py (written by the page's blocks) for two rounds
    on two in-process nodes: FedBN's BatchNorm stays on each node, and the nodes learn."""
    pytest.importorskip("flwr", reason="the Flower extra (flwr) is not installed")
    from flwr.app import Context, Error, Message, RecordDict
    from flwr.serverapp import Grid

    import client_app  # noqa: F401 - the page's files, in the page's folder
    import server_app

    class InProcessGrid(Grid):
        """Nodes that are ClientApp calls in this process, each with its own Context."""

        def __init__(self, nodes: int) -> None:
            from flwr.supercore.task_identity import TaskIdentity  # Messages need one outside a Flower runtime

            TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
            self.outbox: dict[str, Message] = {}
            self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i, "num-partitions": nodes},
                                              state=RecordDict(), run_config={}) for i in range(nodes)}

        def set_run(self, run) -> None:
            pass

        @property
        def run(self):
            return None

        def create_message(self, *args, **kwargs):
            raise NotImplementedError

        def get_node_ids(self):
            return list(self.contexts)

        def push_messages(self, messages):
            ids = []
            for m in messages:
                m.metadata.__dict__["_message_id"] = str(uuid.uuid4())
                try:
                    reply = client_app.app(m, self.contexts[m.metadata.dst_node_id])
                except Exception as exc:  # noqa: BLE001 - as Flower's runtime: an error reply
                    reply = Message(Error(code=2, reason=f"{type(exc).__name__}: {exc}"), reply_to=m)
                self.outbox[m.metadata.message_id] = reply
                ids.append(m.metadata.message_id)
            return ids

        def pull_messages(self, message_ids):
            return [self.outbox.pop(i) for i in list(message_ids) if i in self.outbox]

        def send_and_receive(self, messages, *, timeout=None):
            return self.pull_messages(self.push_messages(messages))

    grid = InProcessGrid(2)
    captured: list = []
    original = server_app.MethodStrategy.start

    def start(self, *args, **kwargs):
        captured.append(original(self, *args, **kwargs))
        return captured[-1]

    server_app.MethodStrategy.start = start
    try:
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"num-rounds": 2}))
    finally:
        server_app.MethodStrategy.start = original
    result = captured[0]
    accuracies = [float(m["eval-accuracy"]) for m in result.evaluate_metrics_clientapp.values()]
    assert len(accuracies) == 2 and accuracies[-1] > 0.5, accuracies  # chance: 0.1
    import torch

    from fednorm.flower.method_client import STATE_KEY

    server = result.arrays.to_torch_state_dict()["body.1.running_mean"]
    assert torch.equal(server, torch.zeros(32))  # FedBN's statistics never reach the server ...
    for context in grid.contexts.values():  # ... each node keeps its own
        own = context.state[STATE_KEY].to_torch_state_dict()["body.1.running_mean"]
        assert not torch.equal(own, server)


# -- what the pages promise of the code (issue 47.5) -------------------------------------------------

def test_dataset_error_is_a_fednorm_error_and_still_a_runtime_error():
    import torch

    from fednorm.data import FederatedData
    from fednorm.errors import DatasetError, FednormError

    assert issubclass(DatasetError, FednormError) and issubclass(DatasetError, RuntimeError)
    with pytest.raises(FednormError, match="test data is empty"):  # one type catches every bad input, as errors.py says
        FederatedData.from_tensors([(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))], test=(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)))


def test_extending_pages_fedper_finds_the_head_of_any_model(page_dir: Path):
    """docs/extending.md's FedPer keeps ``model.head`` of fednorm's models, the last nn.Linear of
    your own, or the module named by ``head=``; a model with none is one line."""
    import torch
    from torch import nn

    import fednorm
    from fednorm.errors import ConfigError
    from fednorm.methods import METHODS

    code = next(b.code for b in python_blocks("docs/extending.md") if b.code.startswith("# file: my_methods.py"))
    (page_dir / "my_methods.py").write_text(code, encoding="utf-8")
    registered = dict(METHODS._entries)
    try:
        import my_methods  # noqa: F401 - registers "fedper"

        g = torch.Generator().manual_seed(0)
        data = fednorm.FederatedData.from_tensors([(torch.randn(8, 6, generator=g), torch.arange(8) % 2) for _ in range(2)],
                                                  test=(torch.randn(4, 6, generator=g), torch.arange(4) % 2))
        net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fednorm.run(model=net, data=data, method="fedper", rounds=1, write=False, progress=False)
            assert result.simulation.method.local_keys == {"2.weight", "2.bias"}  # the user's last Linear, no .head
            named = fednorm.run(model=net, data=data, method="fedper", method_args={"head": "0"}, rounds=1, write=False,
                                progress=False)
            assert named.simulation.method.local_keys == {"0.weight", "0.bias"}
            with pytest.raises(ConfigError, match="fedper: Sequential has no nn.Linear layer to serve as its classifier head"):
                fednorm.run(model=nn.Sequential(nn.Flatten(), nn.Identity()), data=data, method="fedper", rounds=1,
                            write=False, progress=False)
            with pytest.raises(ConfigError, match="fedper: head '1' is a ReLU, not an nn.Linear"):
                fednorm.run(model=net, data=data, method="fedper", method_args={"head": "1"}, rounds=1, write=False,
                            progress=False)
    finally:
        METHODS._entries.clear()
        METHODS._entries.update(registered)
