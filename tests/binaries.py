"""System binaries some tests need (Debian's chromium, prometheus, prometheus-alertmanager): a test without one
skips with the install hint, except under CI (``KFLOOP_CI=1``, set by ``.ci/run``, which installs them), where a
missing binary fails the test instead of hiding it."""
from __future__ import annotations

import os
import shutil

import pytest

CI_ENV = "KFLOOP_CI"


def require_binary(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH; else skip (fail under CI) naming the Debian ``package``."""
    found = next((path for path in map(shutil.which, names) if path), None)
    if found:
        return found
    problem = f"no {' or '.join(names)} binary on PATH (Debian: apt-get install {package})"
    if os.environ.get(CI_ENV) == "1":
        pytest.fail(f"{problem}; {CI_ENV}=1 (.ci/run) requires it")
    pytest.skip(problem)
