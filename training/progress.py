"""Progress lines: every step prints ``[kfloop] ...``; the local runner shows exactly these lines."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console

from data.redaction import redact_text

PREFIX = "[kfloop] "


def progress(text: str, *, stream: TextIO | None = None) -> None:
    """Print one progress line to stderr (a step's log; stdout stays free for results such as ``--json``), redacted
    (:func:`data.redaction.redact_text`)."""
    print(f"{PREFIX}{redact_text(text)}", file=stream or sys.stderr, flush=True)


@contextmanager
def activity(text: str, *, quiet: bool = False) -> Iterator[None]:
    """A spinner with ``text`` on stderr while a long step runs, when stderr is a terminal (not in CI logs,
    pipes or under ``--json``: ``quiet``); otherwise one progress line."""
    if quiet or not sys.stderr.isatty():
        if not quiet:
            progress(text)
        yield
        return
    with Console(stderr=True).status(text):
        yield
