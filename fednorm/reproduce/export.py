"""Copy a suite's run records into a folder meant to be committed, so results outlive the machine.

A full-scale suite runs for days in short sessions on machines that do not keep their disks. What
must survive is what the report reads (each run's config, every evaluation, the summary and the
invocation record, the curve) and, for a run that has not finished, its checkpoint, so that the
next session resumes it from a copy of the exported folder instead of starting again. A finished
run's checkpoint goes along only while it is small (``FINISHED_CHECKPOINT_LIMIT``): the records are
the result, but with the final weights beside them ``fednorm diagnose`` can still ask where a
committed figure comes from; a large one (a model with per-client optimizer state) is removed from
the destination once its run finishes there.

A DSGD run's checkpoint holds every client's momentum (FBN's: 52 of 58 MB). Where the server's
rule for the weights is a linear mean, the exported copy keeps only the momenta's weighted mean,
which continues the run to float rounding (``fednorm.engine.compact``): FBN's checkpoint
becomes small enough to commit. The run's record lists each such export (``compacted_checkpoints``).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .runner import RECORD_NAME

__all__ = ["RECORD_FILES", "CHECKPOINT", "EVALUATION", "FINISHED_CHECKPOINT_LIMIT", "COMPACTED_RECORD", "THIN_CLIENTS",
           "THINNED_RECORD", "ExportResult", "export_runs", "thin_metrics"]

#: The files of a run directory that make its result (what the report and a reader need): text only.
#: Its ``accuracy.png`` is drawn from ``metrics.jsonl`` (``fednorm report RUN_DIR``'s curves) and stays behind: 121 of
#: them were 8 MB of a tracked tree that must travel in 64 MiB.
RECORD_FILES = ("config.yaml", "metrics.jsonl", "summary.json", RECORD_NAME, "partition.json")
CHECKPOINT = "checkpoint.pt"
#: Scores on other test sets (``fednorm evaluate``, a run's extra-test scoring), one entry per test
#: file; merged on export, since a committed copy may hold scores made there.
EVALUATION = "evaluation.json"
#: Bytes up to which a finished run's checkpoint is exported (the CNNs of HBN, FedTAN and LN are 0.6-3 MB;
#: FBN's and FedBN's, with every client's momentum, 40-58 MB, too large to commit).
FINISHED_CHECKPOINT_LIMIT = 5 * 1024 * 1024
#: Key of the run record listing the exports whose checkpoint kept only the clients' mean momentum.
COMPACTED_RECORD = "compacted_checkpoints"
#: Clients above which a finished run's exported ``metrics.jsonl`` keeps each client's accuracy at its last
#: evaluation only. HBN Table 3's K = 1,000 runs write 1,000 of them at each of 59 evaluations (850 KB a
#: run, most of it per-client accuracies of about ten test images each): the table's 96 runs would not fit
#: a tree that travels in 64 MiB. Every other figure of every evaluation stays, the global and the mean
#: client accuracy included; runs of up to this many clients (every other table) are copied as they are.
THIN_CLIENTS = 200
#: Key of the exported run record that says what the thinning left out.
THINNED_RECORD = "thinned_metrics"


@dataclass
class ExportResult:
    copied: list[Path] = field(default_factory=list)  # run directories written in the destination
    kept: list[Path] = field(default_factory=list)  # destination runs further along than the source: left alone
    checkpoints: list[Path] = field(default_factory=list)  # checkpoints now in the destination
    compacted: list[Path] = field(default_factory=list)  # of those, the DSGD checkpoints reduced to the mean momentum


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def _progress(run_dir: Path) -> tuple[bool, int]:
    """(finished, rounds recorded) of a run directory, from its summary and its last evaluation."""
    finished = _read(run_dir / "summary.json").get("status") == "completed"
    rounds = 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                rounds = max(rounds, int(json.loads(line).get("round", 0)))
            except (ValueError, TypeError, AttributeError):
                continue
    return finished, rounds


def _run_dirs(root: Path) -> list[Path]:
    """Every run directory under ``root`` (``<table>/<run>/seed<k>/`` holding a config); the
    reduced scale's data subsets (``_data/``) are not runs."""
    return sorted(p.parent for p in root.glob("*/*/seed*/config.yaml") if not p.parts[len(root.parts)].startswith("_"))


def thin_metrics(text: str, limit: int = THIN_CLIENTS) -> tuple[str, dict | None]:
    """``metrics.jsonl``'s text with ``client_accuracies`` lists of more than ``limit`` clients left
    out of every evaluation but the last that has one, and what was left out (``None``: nothing).
    Other lines are kept byte for byte, so thinning a thinned text changes nothing."""
    lines = text.splitlines(keepends=True)
    rows: list[dict | None] = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        rows.append(row if isinstance(row, dict) else None)
    long = [i for i, row in enumerate(rows)
            if row is not None and isinstance(row.get("client_accuracies"), list) and len(row["client_accuracies"]) > limit]
    if len(long) <= 1:
        return text, None
    for i in long[:-1]:
        row = {k: v for k, v in rows[i].items() if k != "client_accuracies"}
        lines[i] = json.dumps(row) + ("\n" if lines[i].endswith("\n") else "")
    last = rows[long[-1]]
    return "".join(lines), {"field": "client_accuracies", "kept_at_round": last.get("round"),
                            "clients": len(last["client_accuracies"]), "evaluations_thinned": len(long) - 1,
                            "source_bytes": len(text.encode())}


def _same_history(a: Path, b: Path) -> bool:
    """Whether two run directories hold the same evaluations (the same run, not a rerun), the
    per-client accuracies an export thins left aside."""
    ma, mb = a / "metrics.jsonl", b / "metrics.jsonl"
    if not (ma.is_file() and mb.is_file()):
        return False
    ta, tb = ma.read_text(), mb.read_text()
    return ta == tb or thin_metrics(ta)[0] == thin_metrics(tb)[0]


def _copy_metrics(run: Path, target: Path, thin: bool) -> None:
    """Copy the run's ``metrics.jsonl``; a finished run's thinned (:func:`thin_metrics`), with a note
    in the exported record of what was left out."""
    source = run / "metrics.jsonl"
    text, left_out = thin_metrics(source.read_text()) if thin else (None, None)
    if left_out is None:
        shutil.copy2(source, target / "metrics.jsonl")
        return
    (target / "metrics.jsonl").write_text(text)
    path = target / RECORD_NAME
    record = _read(path)
    record[THINNED_RECORD] = left_out
    path.write_text(json.dumps(record, indent=2) + "\n")


def _merge_evaluations(source: Path, target: Path, rounds: int, same_run: bool) -> None:
    """The run's scores on other test sets, over the committed copy's: an entry of the copy stays
    only while the copy holds the same run and it scores the round the run has reached (a score
    of an older checkpoint, or of another run of the cell, is stale)."""
    kept = {name: entry for name, entry in _read(target).items()
            if same_run and isinstance(entry, dict) and entry.get("round") == rounds}
    merged = {**kept, **_read(source)}
    if merged:
        target.write_text(json.dumps(merged, indent=2) + "\n")
    elif target.is_file():
        target.unlink()


def _client_sizes(run_dir: Path) -> list[int] | None:
    """Each client's training samples, from the run's ``partition.json`` (None when absent)."""
    counts = _read(run_dir / "partition.json").get("train_label_counts")
    return [int(sum(row)) for row in counts] if isinstance(counts, list) else None


def _copy_checkpoint(run: Path, target: Path) -> dict | None:
    """Copy ``run``'s checkpoint to ``target``; a DSGD checkpoint whose momenta may be replaced by
    their mean is written compacted (atomically). Returns the record entry of a compaction."""
    import torch

    from ..engine.compact import compact_checkpoint, mean_momentum_exact
    from .report import _saved_config

    source, dest = run / CHECKPOINT, target / CHECKPOINT
    sizes = _client_sizes(run)
    # the saved config decides before the checkpoint is loaded; compact_checkpoint checks the checkpoint's own
    if sizes is None or mean_momentum_exact(_saved_config(run)) is not None:
        shutil.copy2(source, dest)
        return None
    state = torch.load(source, map_location="cpu", weights_only=True)
    try:
        info = compact_checkpoint(state, sizes)
    except ValueError as exc:  # e.g. a partition that does not match the bank: keep every momentum
        warnings.warn(f"{source}: exported whole: {exc}", stacklevel=3)
        shutil.copy2(source, dest)
        return None
    tmp = dest.with_name(f".{dest.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, dest)
    return {"round": info.round, "clients": info.clients, "bytes": source.stat().st_size, "compacted_bytes": dest.stat().st_size}


def _note_compaction(target: Path, entry: dict) -> None:
    """Add ``entry`` to the exported record's list of compacted checkpoints (once per round)."""
    path = target / RECORD_NAME
    record = _read(path)
    entries = [e for e in record.get(COMPACTED_RECORD, []) if e.get("round") != entry["round"]]
    record[COMPACTED_RECORD] = [*entries, entry]
    path.write_text(json.dumps(record, indent=2) + "\n")


def export_runs(source: str | Path, dest: str | Path, *, checkpoints: bool = False,
                finished_limit: int = FINISHED_CHECKPOINT_LIMIT) -> ExportResult:
    """Copy every run's records from the suite folder ``source`` into ``dest`` (same layout).

    A run already in ``dest`` that is further along (more rounds recorded, or as many and
    finished there) is left alone, so exporting an older working copy never loses a result; a
    finished run there is replaced only by its own record (the same evaluations: its scores on
    other test sets merge in), never by another run of the same cell and rounds. With
    ``checkpoints``, the ``checkpoint.pt`` of an unfinished run, or of a full-scale run that has
    stopped short of the paper's rounds (a stated fraction, to be extended), goes along (resume
    by running the same ``fednorm reproduce`` command with ``--out`` on a copy of ``dest``); a
    finished run's goes along when it is at most ``finished_limit`` bytes (for ``fednorm
    diagnose``; 0 keeps none). A DSGD checkpoint is exported with its clients' mean momentum
    where that continues the run (see the module docstring).
    """
    source, dest = Path(source).resolve(), Path(dest).resolve()
    result = ExportResult()
    for run in _run_dirs(source):
        target = dest / run.relative_to(source)
        finished, rounds = _progress(run)
        same = False
        if target.is_dir():
            was_finished, was_rounds = _progress(target)
            same = _same_history(run, target)
            # a finished run is further along only against one at no more rounds: a run finished at
            # a stated fraction (--rounds 50) and then extended past it elsewhere is behind. Another
            # finished record of as many rounds (a rerun, or a stale copy of one) never replaces it.
            if was_rounds > rounds or (was_finished and was_rounds >= rounds and not (finished and same)):
                if same:
                    _merge_evaluations(run / EVALUATION, target / EVALUATION, rounds, same_run=True)
                result.kept.append(target)
                continue
        target.mkdir(parents=True, exist_ok=True)
        record = _read(run / RECORD_NAME)
        # A full-scale run stopped at a stated fraction (--rounds) is finished for now but will be
        # extended: it keeps its checkpoint until it has the paper's rounds.
        partial = record.get("scale") == "full" and rounds < int(record.get("paper_rounds") or 0)
        for name in RECORD_FILES:
            if name == "metrics.jsonl" and (run / name).is_file():
                continue  # after the record, which notes a thinning
            if (run / name).is_file():
                shutil.copy2(run / name, target / name)
            elif name != RECORD_NAME and (target / name).is_file():
                (target / name).unlink()  # a stale file of an earlier export (e.g. a summary the run no longer has)
        if (run / "metrics.jsonl").is_file():
            # only a finished run is thinned: one that resumes from the copy reads its whole history
            _copy_metrics(run, target, thin=finished and not partial)
        _merge_evaluations(run / EVALUATION, target / EVALUATION, rounds, same_run=same)
        stale = target / CHECKPOINT
        source_ckpt = run / CHECKPOINT
        small = source_ckpt.is_file() and source_ckpt.stat().st_size <= finished_limit
        if checkpoints and source_ckpt.is_file() and (not finished or partial or small):
            entry = _copy_checkpoint(run, target)
            if entry is not None:
                _note_compaction(target, entry)
                result.compacted.append(stale)
            result.checkpoints.append(stale)
        elif stale.is_file() and finished and not partial:
            stale.unlink()  # a finished run's old checkpoint; an unfinished run's is kept: it is how the run resumes
        result.copied.append(target)
    return result
