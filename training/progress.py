"""Progress lines: every step prints ``[kfloop] ...``; the local runner shows exactly these lines."""
from __future__ import annotations

import sys
from typing import TextIO

PREFIX = "[kfloop] "


def progress(text: str, *, stream: TextIO | None = None) -> None:
    """Print one progress line to stderr (a step's log; stdout stays free for results such as ``--json``)."""
    print(f"{PREFIX}{text}", file=stream or sys.stderr, flush=True)
