"""Argo's emissary emulation (tests/cluster/argo_emissary.py) against argo-workflows v4.0.5's own cases:
``cmd/argoexec/commands/emissary_test.go`` ``TestEmissary``, each subtest under its name, run as upstream's
``run(script)`` does (``sh -c SCRIPT``, container ``main``, ``includeScriptOutput`` on, ``varRunArgo`` a temporary
folder).

Not ported: ``Artifact``, ``ArtifactWithTrailingAndLeadingSlash``, ``Parameter``, ``RetryContainerSetFail`` and
``RetryContainerSetSuccess`` (they drive the emissary through the ``template`` file: outputs saved under
``outputs/``, container-set retries, which KFP's step templates do not use and the emulation does not read);
``osspecific/command_test.go`` ``TestSimpleStartCloser`` (Go's ``exec.Cmd`` copying through a slow writer: the
emulation copies in its own threads, covered by ``Stdout`` and ``Sub-process``); ``emissary_windows_test.go``
(Windows).
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EMISSARY = Path(__file__).parent / "argo_emissary.py"


def run(var_run_argo: Path, script: str) -> int:
    """emissary_test.go ``run``: the emissary of container ``main`` running ``sh -c script``; its exit code."""
    env = {**os.environ, "ARGO_CONTAINER_NAME": "main", "ARGO_INCLUDE_SCRIPT_OUTPUT": "true"}
    return subprocess.run([sys.executable, str(EMISSARY), str(var_run_argo / "argoexec"), "--", "sh", "-c", script],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode


CASES = [  # (name, script, exit code, file under ctr/main, what it holds (in it, or all of it with "="))
    ("Exit0", "exit", 0, "exitcode", "=0"),
    ("Exit1", "exit 1", 1, "exitcode", "=1"),
    ("Stdout", "echo hello", 0, "stdout", "hello"),
    ("Sub-process", "(sleep 60; echo 'should not wait for sub-process')& echo \"hello\\c\"", 0, "stdout", "=hello"),
    ("Combined", "echo hello > /dev/stderr", 0, "combined", "hello"),
]


@pytest.mark.parametrize("name, script, code, file, holds", CASES, ids=[c[0] for c in CASES])
def test_emissary(tmp_path, name, script, code, file, holds):
    assert run(tmp_path, script) == code
    data = (tmp_path / "ctr" / "main" / file).read_text()
    assert data == holds[1:] if holds.startswith("=") else holds in data


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_emissary_signal(tmp_path, signum):
    """``Signal``: a signal number in ``ctr/main/signal`` ends ``sleep 3``: exit status 128 + signal."""
    (tmp_path / "ctr" / "main").mkdir(parents=True)
    (tmp_path / "ctr" / "main" / "signal").write_text(str(int(signum)))
    assert run(tmp_path, "sleep 3") == 128 + signum
    assert (tmp_path / "ctr" / "main" / "exitcode").read_text() == str(128 + signum)
    assert not (tmp_path / "ctr" / "main" / "signal").exists()


def test_a_command_not_on_path_never_runs(tmp_path):
    """emissary.go: ``exec.LookPath`` fails, the ``exitcode`` stays 64, as main.go's exit for any other error."""
    env = {**os.environ, "ARGO_CONTAINER_NAME": "main"}
    done = subprocess.run([sys.executable, str(EMISSARY), str(tmp_path / "argoexec"), "--", "no-such-command"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, (tmp_path / "ctr" / "main" / "exitcode").read_text()) == (64, "64")
    assert "failed to find name in PATH" in done.stderr
