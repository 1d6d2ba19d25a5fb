"""Progress lines: every step prints ``[kfloop] ...``; the local runner shows exactly these lines."""
from __future__ import annotations

import sys
from typing import TextIO

PREFIX = "[kfloop] "


def progress(text: str, *, stream: TextIO | None = None) -> None:
    """Print one progress line (default: stdout, which is a step's log)."""
    print(f"{PREFIX}{text}", file=stream or sys.stdout, flush=True)
