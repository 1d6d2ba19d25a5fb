"""Synchronisation for tests: poll a condition with a deadline, never sleep a fixed time."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, interval: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
