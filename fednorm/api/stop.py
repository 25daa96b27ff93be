"""Stopping a run cleanly: the first SIGINT/SIGTERM, or a stop file, asks the run (or the
comparison) to stop after the current round, with a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["STOP_FILE_ENV", "STOPPING_MESSAGE", "StopRequest"]


#: A file whose appearance asks a run to stop after the current round, as a first SIGINT/SIGTERM
#: does; it holds the signal's number. ``fednorm launch`` sets it for its workers, which run in
#: their own session so that a Ctrl-C reaches the launcher only (torchrun would print a traceback).
STOP_FILE_ENV = "FEDNORM_STOP_FILE"

#: What the first signal prints (stderr): the run goes on to the end of its round.
STOPPING_MESSAGE = "fednorm: stopping after this round with a checkpoint (signal again to stop at once)"


class StopRequest:
    """Turns the first SIGINT/SIGTERM (or the stop file of :data:`STOP_FILE_ENV`) into a request
    to stop after the current round."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._file = os.environ.get(STOP_FILE_ENV) or None

    @property
    def requested(self) -> bool:
        if self.signal is None and self._file is not None:
            try:
                text = Path(self._file).read_text().strip()
            except OSError:
                return False
            self.signal = int(text) if text.isdigit() else 2  # SIGINT's number when the file gives none
        return self.signal is not None

    def __enter__(self) -> "StopRequest":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.signal = signum
        # Said at once, so the user (or a test) knows this signal arrived: two signals that land
        # while the process is inside one long native call reach Python as one.
        import sys

        print(STOPPING_MESSAGE, file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
