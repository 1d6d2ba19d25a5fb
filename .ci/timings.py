"""CI's clock: turns the phase log `.ci/run` writes into a table and ``ci-timings.json``, and warns over budget.

Each line of the log is ``NAME START SECONDS RC`` (START in epoch seconds); ``deploy/e2e.sh`` appends its own steps
as ``e2e:STEP``. The tests' durations come from the suite (``KFLOOP_TEST_TIMINGS``, written by tests/conftest.py).
The budget per phase is :data:`BUDGET_MINUTES`, the one home of the numbers docs/ci.md states (a test compares them).
Standard library only: it runs before and after the venv exists.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TOTAL_BUDGET_MINUTES = 45
"""CI's whole run, wall clock (its hard limit is 90)."""
BUDGET_MINUTES = {"apt": 3, "setup": 5, "docs": 1, "image": 12, "tests": 25, "e2e": 10}
"""Minutes per phase on CI's cold 2-core machine; ``image`` runs beside ``docs`` and ``tests``, so the phases add up
to more than the total."""


def read_log(log: Path) -> list[dict]:
    """The phases in the order they started, each with its name, start (epoch s), seconds and exit status."""
    phases = []
    for line in log.read_text().splitlines():
        name, start, seconds, rc = line.split()
        phases.append({"name": name, "start": int(start), "seconds": int(seconds), "rc": int(rc)})
    return sorted(phases, key=lambda phase: phase["start"])


def report(log: Path, tests: Path | None, out: Path, started: int, ended: int) -> dict:
    """Write ``out`` (JSON) from the phase log and the tests' durations; return it."""
    phases = read_log(log)
    for phase in phases:
        phase["offset"] = phase["start"] - started
        budget = BUDGET_MINUTES.get(phase["name"])
        if budget is not None:
            phase["budget_seconds"] = budget * 60
    slowest = json.loads(tests.read_text()) if tests is not None and tests.is_file() else []
    total = ended - started
    over = [p["name"] for p in phases if p.get("budget_seconds") is not None and p["seconds"] > p["budget_seconds"]]
    result = {"total_seconds": total, "total_budget_seconds": TOTAL_BUDGET_MINUTES * 60, "over_budget": over,
              "phases": phases, "slowest_tests": slowest}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    return result


def print_table(result: dict) -> None:
    print(f"{'phase':<28}{'start':>8}{'seconds':>9}{'budget':>8}  rc")
    for phase in result["phases"]:
        budget = phase.get("budget_seconds", "")
        print(f"{phase['name']:<28}{phase['offset']:>8}{phase['seconds']:>9}{budget:>8}  {phase['rc']}")
    print(f"{'total (wall)':<28}{'':>8}{result['total_seconds']:>9}{result['total_budget_seconds']:>8}")
    for test in result["slowest_tests"][:10]:
        print(f"  {test['seconds']:8.1f} s  {test['nodeid']}")
    if result["total_seconds"] > result["total_budget_seconds"]:
        worst = max((p for p in result["phases"] if "budget_seconds" in p),
                    key=lambda p: p["seconds"] - p["budget_seconds"], default=None)
        named = ", ".join(result["over_budget"]) or (worst["name"] if worst else "none")
        print(f"ci: WARNING: the run took {result['total_seconds'] // 60} min, over its "
              f"{TOTAL_BUDGET_MINUTES} min budget; over their own budget: {named} (docs/ci.md)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="the phase log .ci/run wrote")
    parser.add_argument("--tests", type=Path, help="the suite's slowest tests (JSON), if it ran")
    parser.add_argument("--out", type=Path, required=True, help="where to write ci-timings.json")
    parser.add_argument("--started", type=int, required=True, help="epoch seconds when .ci/run started")
    parser.add_argument("--ended", type=int, required=True, help="epoch seconds when it ended")
    args = parser.parse_args(argv)
    print_table(report(args.log, args.tests, args.out, args.started, args.ended))
    return 0


if __name__ == "__main__":
    sys.exit(main())
