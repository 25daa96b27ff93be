"""A Ctrl-C at a chosen point of a ``fednorm compare``, shared by the tests of interrupted comparisons."""

from __future__ import annotations

import os
import signal
from typing import Any

from fednorm.cli import progress as progress_mod


def sigint_at(monkeypatch: Any, variant: int = 2, server_round: int = 2) -> Any:
    """Send this process SIGINT after ``variant``'s round ``server_round`` (as its progress line is
    printed); returns the unpatched ``ProgressLines.__call__`` to restore it."""
    original = progress_mod.ProgressLines.__call__

    def call(self: Any, record: Any, sim: Any) -> None:
        original(self, record, sim)
        if self._index == variant and record.server_round == server_round:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(progress_mod.ProgressLines, "__call__", call)
    return original
