"""The command line's warnings: one line each, and each text once per command."""

from __future__ import annotations

import warnings

from fednorm.cli.errors import one_line_warnings


def _warn_here(text: str) -> None:
    warnings.warn(text, stacklevel=1)


def test_a_warning_text_is_shown_once_per_command_whatever_its_origin(capsys):
    before = warnings.showwarning
    try:
        one_line_warnings("fednorm compare")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            _warn_here("batch_size=4 exceeds the training samples of 1 of 10 clients")
            warnings.warn("batch_size=4 exceeds the training samples of 1 of 10 clients", stacklevel=1)  # another line
            warnings.warn("another   message,\n on two lines", stacklevel=1)
    finally:
        warnings.showwarning = before
    err = capsys.readouterr().err.splitlines()
    assert err == ["fednorm compare: warning: batch_size=4 exceeds the training samples of 1 of 10 clients",
                   "fednorm compare: warning: another message, on two lines"]
