"""pytest plugin of ``make chaos``: counts the fault-injection tests (marker ``chaos``) and prints a summary.

Every chaos test injects one fault (a killed or stalled process, a damaged file, bad input) and asserts that the
loop survived it without losing anything: checkpoints, model versions, the champion and the trigger state are
checked by the test itself. A failed chaos test is therefore reported as possible data loss, never hidden.
"""
from __future__ import annotations

import pytest

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "chaos" not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":  # a setup or teardown error counts against the test
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter) -> None:
    injected = len(_outcomes)
    survived = sum(outcome == "passed" for outcome in _outcomes.values())
    skipped = sum(outcome == "skipped" for outcome in _outcomes.values())
    failed = injected - survived - skipped
    terminalreporter.write_sep("=", "chaos summary")
    terminalreporter.write_line(f"faults injected: {injected - skipped}")
    terminalreporter.write_line(f"survived:        {survived}")
    terminalreporter.write_line(f"data lost:       {failed}" + (" (failed chaos tests above: each may have lost "
                                                                  "data)" if failed else ""))
