"""The one base of kfloop's own errors: each says what went wrong, the exit code the CLI returns for it, and a
hint with the fix, so the CLI maps an error to its exit code by its type."""
from __future__ import annotations

EXIT_FAILED = 1
"""Validation failures, a failed pipeline run or training launch."""
EXIT_DATA_FILE = 3
"""The data file itself is unusable (missing, empty, truncated, undecodable...); 2 is argparse's usage error."""


class KfloopError(Exception):
    """An error kfloop reports to its user: the message names the problem, :attr:`hint` the fix."""

    exit_code: int = EXIT_FAILED
    """What ``kfloop`` exits with when this error ends a command."""
    hint: str = ""
    """How to fix it, when the message alone does not say."""

