"""Text kept to a bounded length: the one cut of every message, tag value and echoed value kfloop writes."""
from __future__ import annotations


def shorten(text: str, limit: int, *, show_length: bool = False) -> str:
    """``text`` cut to at most ``limit`` characters, ending ``...`` where it was cut, or with ``show_length``
    ``... (N chars)``, N the length before the cut (the marker alone where ``limit`` is shorter than it)."""
    if len(text) <= limit:
        return text
    marker = f"... ({len(text)} chars)" if show_length else "..."
    return text[:max(limit - len(marker), 0)] + marker
