"""One redaction for every message (issue 41): a tracking URI's password, presigned parameters, bearer tokens and
the environment's secrets never reach an error, a log line, a run parameter or an MLflow tag."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from filelock import FileLock

from data.redaction import redact, redact_text
from data.text import shorten
from monitoring.trigger_registry import RegistryTriggerStore
from training.progress import progress
from training.registry.versions import RegistryUnavailableError, rollback

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "S3CRETPW"
LEAKY_URI = f"http://alice:{PASSWORD}@127.0.0.1:1"


@pytest.mark.parametrize("text, shown", [
    (f"cannot reach {LEAKY_URI}/api/2.0/mlflow/registered-models/get", "cannot reach http://***@127.0.0.1:1/api/2.0/"
                                                                       "mlflow/registered-models/get"),
    ("GET https://b.s3.amazonaws.com/x.csv?X-Amz-Credential=AKIAX&X-Amz-Signature=abc123SIG: 403",
     "GET https://b.s3.amazonaws.com/x.csv 403"),  # the query ends at the next space
    ("signed with X-Goog-Signature=abc123SIG&sig=def456SIG", "signed with X-Goog-Signature=***&sig=***"),
    ("header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc123SIG", "header Authorization: Bearer ***"),
])
def test_messages_lose_user_info_presigned_parameters_and_tokens(text, shown):
    assert redact_text(text) == shown


def test_secret_values_of_the_environment_are_masked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # not a secret: kept
    text = "boto said: signature mismatch for wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY in eu-west-1"
    assert redact_text(text) == "boto said: signature mismatch for *** in eu-west-1"
    assert redact("/mnt/wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY/x.csv") == "/mnt/***/x.csv"


def test_log_lines_and_the_trigger_state_name_the_tracking_uri_without_its_password(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", LEAKY_URI)
    out = io.StringIO()
    progress(f"register: MLflow at {mlflow.get_tracking_uri()}", stream=out)
    assert out.getvalue() == "[kfloop] register: MLflow at http://***@127.0.0.1:1\n"
    assert PASSWORD not in RegistryTriggerStore("churn").path


def test_an_unreachable_registry_is_named_without_its_password(monkeypatch, tmp_path):
    for name, value in {"MLFLOW_TRACKING_URI": LEAKY_URI, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RegistryUnavailableError) as err:
        rollback("churn", reason="bad model", actor="test", lock=FileLock(tmp_path / "lock"))
    assert "MLflow at http://127.0.0.1:1 did not answer" in str(err.value)
    assert PASSWORD not in str(err.value)


@pytest.mark.parametrize("args", [["status", "--model", "churn"], ["status", "--model", "churn", "--json"]])
def test_cli_errors_about_the_registry_never_show_its_password(tmp_path, args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": LEAKY_URI,
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    done = subprocess.run([sys.executable, "-m", "pipelines", "--workdir", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert "127.0.0.1:1" in done.stdout + done.stderr  # the error is about the registry...
    assert PASSWORD not in done.stdout + done.stderr  # ...and does not show its password


@pytest.mark.parametrize("limit", [10, 40, 80])
def test_shorten_keeps_text_within_its_limit_and_marks_the_cut(limit):
    text = "x" * 500
    assert shorten("short", limit) == "short" and shorten(text[:limit], limit) == text[:limit]
    cut, counted = shorten(text, limit), shorten(text, limit, show_length=True)
    assert len(cut) == limit and cut.endswith("...") and cut[:-3] == text[:limit - 3]
    assert counted.endswith("... (500 chars)") and len(counted) == max(limit, len("... (500 chars)"))
