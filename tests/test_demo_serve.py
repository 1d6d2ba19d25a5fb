"""`kfloop demo --serve --json`: the loop through a real `kfloop serve-model` child process and its inference logs;
the drift checks read the logged requests, agree with the checks of the same rows as tables, and the restarted
server's logs name the champion after retraining."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from data.settings import CODE_ROOT
from monitoring.inference_logs import parse_since, read_inference_logs

pytestmark = pytest.mark.timeout(1800)  # the whole loop and serve-model, twice, on a busy 2-core box


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo-serve")
    env = {**{k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME")},
           "PYTHONPATH": str(CODE_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pipelines", "demo", "--serve", "--json", "--workdir", str(workdir)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_sent_row_is_logged_and_read_back(served):
    serving = served["serving"]
    for window in ("stable_batch", "drifted_batch", "after_retraining"):
        w = serving[window]
        assert w["requests_sent"] >= 1 and w["rows_sent"] > 0
        assert (w["requests_logged"], w["rows_logged"]) == (w["requests_sent"], w["rows_sent"]), window
    assert serving["stable_batch"]["rows_sent"] == 2000 and serving["drifted_batch"]["rows_sent"] == 4000
    everything = read_inference_logs(serving["log_dir"], since=parse_since("1d"))
    assert len(everything.rows) == sum(serving[w]["rows_sent"] for w in ("stable_batch", "drifted_batch",
                                                                          "after_retraining"))


def test_the_checks_of_the_logged_windows_agree_with_the_tables(served):
    serving = served["serving"]
    assert serving["stable_batch"]["drifted_from_logs"] is serving["stable_batch"]["drifted_from_table"] is False
    assert serving["drifted_batch"]["drifted_from_logs"] is serving["drifted_batch"]["drifted_from_table"] is True
    stable, drifted = served["stable_batch"], served["drifted_batch"]
    assert stable["drifted"] is False and stable["retrain"] is None
    for check, table in ((stable, "batch_stable.parquet"), (drifted, "batch_drifted.parquet")):
        assert check["data_md5"] != served["data_md5"][table]  # the logged rows (with their request ids) were read
    retrain = drifted["retrain"]
    assert retrain["model_version"] == "2"
    versions = {v["version"]: v for v in served["versions"]}
    assert versions["2"]["data_md5"] == served["data_md5"]["batch_drifted.parquet"]  # trained on the drifted table


def test_the_restarted_server_logs_the_new_champion(served):
    serving = served["serving"]
    assert serving["stable_batch"]["versions"] == serving["drifted_batch"]["versions"] == ["1"]
    retrain = served["drifted_batch"]["retrain"]
    assert retrain["promoted"] is True and retrain["champion_version"] == "2"  # the demo's gate promotes v2
    assert serving["after_retraining"]["versions"] == ["2"]
