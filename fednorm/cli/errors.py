"""How the ``fednorm`` command reports bad input: one line on stderr, exit status 2, no traceback.

:class:`ArgumentParser` is argparse's parser with three changes: no prefix matching of long
options (``--round`` is not silently ``--rounds``), a "did you mean" for an unrecognized option,
and an error that is one line (``fednorm run: error: ... (see 'fednorm run --help')``) instead of
the full usage of a command that has sixty options. :func:`one_line_warnings` prints Python
warnings (a partition that had to be repaired, a checkpoint fallback) as one line each.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import warnings
from typing import Any, NoReturn, Sequence

__all__ = ["ArgumentParser", "suggest_options", "one_line_warnings", "EXIT_BAD_INPUT", "EXIT_FAILED", "exit_code_for_signal"]

EXIT_BAD_INPUT = 2  # the command line, a config, a path or the data is wrong: nothing ran
EXIT_FAILED = 1  # the run started and failed (divergence, lost clients, checkpoint)


def exit_code_for_signal(signum: int | None) -> int:
    """The shell's status for a process stopped by ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    import signal

    return 128 + int(signum if signum is not None else signal.SIGINT)


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def suggest_options(unknown: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """``"; did you mean --rounds?"`` for the first unrecognized option with a close valid one."""
    options = _long_options(parser)
    for word in unknown:
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        prefixed = [o for o in options if o.startswith(name)]
        close = prefixed[:3] if prefixed else difflib.get_close_matches(name, options, n=3, cutoff=0.6)
        if close:
            return f"; did you mean {' or '.join(close)}?"
    return ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse without prefix matching, with one-line errors and "did you mean" suggestions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _subcommand_parser(self, namespace: argparse.Namespace) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(namespace, action.dest or "", None) or "")
        return None

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self._subcommand_parser(ns) or self
            target.error(f"unrecognized arguments: {' '.join(extras)}{suggest_options(extras, target)}")
        return ns


def one_line_warnings(prog: str = "fednorm") -> None:
    """Show each warning as ``fednorm: warning: message`` (no file name, line or source line), each
    text once per command: a comparison builds the same data for every variant (and each executor
    kind checks it), which is one thing to say, not one per variant."""
    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
        stream = file or sys.stderr
        text = " ".join(str(message).split())
        if text in shown:
            return
        shown.add(text)
        try:
            stream.write(f"{prog}: warning: {text}\n")
        except (OSError, ValueError):  # a closed stream: warnings must never fail the run
            pass

    warnings.showwarning = show
