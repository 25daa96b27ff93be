"""A run's record names the code that trained it: ``summary.json``'s ``code`` has one entry per
start and per resume, with the commit of fednorm's checkout, so a run resumed under another
commit says so (as the reproduce records' invocations do)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fednorm import api, code_version

REPO = Path(__file__).resolve().parents[1]
BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2, batch_size=32,
            lr=0.05, model="mlp", norm="bn", seed=3)


def _head() -> str | None:
    top = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO.resolve():
        return None
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fresh_code(monkeypatch):
    monkeypatch.delenv("FEDNORM_COMMIT", raising=False)
    code_version._process_code.cache_clear()
    yield
    code_version._process_code.cache_clear()


def test_a_resumed_run_records_the_code_of_each_start(tmp_path, monkeypatch, fresh_code):
    out = tmp_path / "run"
    api.run(rounds=2, checkpoint_every=1, out=str(out), progress=False, **BASE)
    first = json.loads((out / "summary.json").read_text())["code"]
    assert [e["from_round"] for e in first] == [0]
    head = _head()
    if head is not None:  # fednorm runs from this checkout (the editable install the suite uses)
        assert first[0]["commit"] == head and isinstance(first[0]["dirty"], bool)
    # the resume runs "elsewhere": a copy of the tree that states its commit
    code_version._process_code.cache_clear()
    monkeypatch.setenv("FEDNORM_COMMIT", "f" * 40)
    resumed = api.run(resume=out, rounds=4, progress=False)
    code = json.loads((out / "summary.json").read_text())["code"]
    assert code == resumed.summary["code"]
    assert code[0] == first[0] and len(code) == 2
    assert code[1]["from_round"] == 2 and code[1]["commit"] == "f" * 40 and code[1]["dirty"] is None


def test_the_list_travels_in_the_checkpoint(tmp_path, monkeypatch, fresh_code):
    """A run resumed from round 2 after a later start under commit B reached round 4 names A from
    0 and C from 2, not B, whose rounds were thrown away; a resume with nothing left to train
    still appends its own entry (it wrote the summary)."""
    import shutil

    out, saved = tmp_path / "run", tmp_path / "round2.pt"
    monkeypatch.setenv("FEDNORM_COMMIT", "a" * 40)
    api.run(rounds=2, checkpoint_every=2, out=str(out), progress=False, **BASE)
    shutil.copy(out / "checkpoint.pt", saved)
    code_version._process_code.cache_clear()
    monkeypatch.setenv("FEDNORM_COMMIT", "b" * 40)
    api.run(resume=out, rounds=4, progress=False)
    shutil.copy(saved, out / "checkpoint.pt")  # B's rounds lost: the run continues from round 2 again
    (out / "checkpoint.prev.pt").unlink(missing_ok=True)
    code_version._process_code.cache_clear()
    monkeypatch.setenv("FEDNORM_COMMIT", "c" * 40)
    again = api.run(resume=out, rounds=4, progress=False)
    assert [(e["from_round"], e["commit"][0]) for e in again.summary["code"]] == [(0, "a"), (2, "c")]
    code_version._process_code.cache_clear()
    monkeypatch.setenv("FEDNORM_COMMIT", "d" * 40)
    done = api.run(resume=out, rounds=4, progress=False)
    assert [(e["from_round"], e["commit"][0]) for e in done.summary["code"]] == [(0, "a"), (2, "c"), (4, "d")]


def test_fednorm_installed_inside_another_repository_has_no_commit(tmp_path):
    repo = tmp_path / "project"
    package_root = repo / ".venv" / "site-packages"
    (package_root / "fednorm").mkdir(parents=True)
    (repo / "x.txt").write_text("x\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True)
    assert code_version.git_info(package_root) == {"commit": None, "dirty": None}
    assert code_version.git_info(repo)["commit"] is not None
