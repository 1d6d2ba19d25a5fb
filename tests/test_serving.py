"""``kfloop serve-model`` (issue 42 item 1): a registered version on the shared real ``mlflow server`` served by a
real ``kfloop serve-model`` process (kserve's ModelServer), asked over Open Inference Protocol v2 with kserve's own
client and request types; its answers are the pyfunc's, row for row, and bad requests get the SDK's 4xx."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from kserve.inference_client import InferenceGRPCClient, InferenceRESTClient, RESTConfig
from polling import wait_for
from serving_versions import register_version, tracking

from cluster.server_process import free_ports
from data.schema_rules import DEFAULT_LIMITS
from monitoring.inference_logs import read_inference_logs
from training.serving.load import ModelSource
from training.serving.predictor import KfloopPredictor
from training.serving.table import response_table, table_request

MODEL = "served-churn"
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def registered(mlflow_server, tmp_path_factory):
    """Version 1 of :data:`MODEL` on the shared MLflow server, and the pyfunc every consumer loads."""
    root = tmp_path_factory.mktemp("serving")
    with tracking(mlflow_server.url, "kfloop-serving") as experiment_id:
        version, rows = register_version(MODEL, experiment_id=experiment_id, root=root)
        mlflow.MlflowClient().set_registered_model_alias(MODEL, "champion", version)  # served by --alias champion
        yield version, mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}"), rows


@pytest.fixture(scope="module")
def server(registered, mlflow_server, tmp_path_factory):
    """A ``kfloop serve-model`` process serving version 1: its base URL once ``/v2/models/<name>/ready`` says so,
    and its gRPC port in ``server.grpc_port``."""
    version = registered[0]
    port, grpc_port = free_ports(2)
    folder = tmp_path_factory.mktemp("serve-model")
    log, payloads = folder / "serve.log", folder / "payloads"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", "serve-model", "--model", MODEL, "--alias",
                                 "champion", "--port", str(port), "--grpc-port", str(grpc_port), "--log-dir",
                                 str(payloads)],
                                env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, f"serve-model exited {proc.returncode}: {log.read_text()[-3000:]}"
        return _status(f"{url}/v2/models/{MODEL}/ready") == 200

    try:
        wait_for(f"serve-model's /v2/models/{MODEL}/ready", ready, timeout=START_TIMEOUT_S, interval=0.2)
        yield Served(url, grpc_port, payloads)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


class Served(str):
    """The server's base URL, with its gRPC port and the folder of its inference logs (``--log-dir``)."""

    def __new__(cls, url: str, grpc_port: int, payloads: Path):
        served = super().__new__(cls, url)
        served.grpc_port, served.payloads = grpc_port, payloads
        return served


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _infer(url: str, frame: pd.DataFrame, request_id: str | None = None, **parameters: str) -> pd.DataFrame:
    request = table_request(frame, MODEL, **parameters)
    request.id = request_id

    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
        try:
            return await client.infer(url, request, model_name=MODEL)
        finally:
            await client.close()
    return response_table(asyncio.run(call()))


def _table_body(frame: pd.DataFrame, **parameters: str) -> dict:
    body, _ = table_request(frame, MODEL, **parameters).to_rest()
    return body


def test_v2_answers_are_the_pyfuncs_row_for_row(registered, server):
    _, pyfunc, rows = registered
    rows = rows.assign(region=rows["region"].where(rows.index % 50 != 7, "atlantis"))  # some rows break the schema
    served = _infer(server, rows)
    expected = pyfunc.predict(rows)
    assert list(served.columns) == list(expected.columns)
    atlantis = (rows["region"] == "atlantis").to_numpy()
    assert atlantis.sum() == 6 and served["schema_violations"][atlantis].str.contains("atlantis").all()
    for column in expected.columns:
        if expected[column].dtype == object:
            assert served[column].tolist() == expected[column].tolist(), column
        else:
            np.testing.assert_allclose(served[column].to_numpy(), expected[column].to_numpy(), rtol=1e-6)


def test_served_requests_are_logged_as_kserves_logger_writes_them_and_read_back_as_rows(registered, server):
    """``--log-dir``: each answered request and its response as a blob pair of KServe's payload logger, tagged with
    the version the alias named when the server started; the reader gives back the rows sent and the answers."""
    version, pyfunc, rows = registered
    sent = rows.head(25)
    served = _infer(server, sent, request_id="logged-request-1")
    logged = read_inference_logs(str(server.payloads), since=timedelta(hours=1)).rows
    mine = logged[logged["request_id"] == "logged-request-1"].reset_index(drop=True)
    assert len(mine) == len(sent)
    assert set(mine["model_version"]) == {version} and set(mine["model_name"]) == {MODEL}
    pd.testing.assert_frame_equal(mine[list(sent.columns)], sent.reset_index(drop=True), check_dtype=False)
    assert mine["prediction"].tolist() == served["prediction"].tolist() == pyfunc.predict(sent)["prediction"].tolist()


def test_grpc_answers_as_rest_does(registered, server):
    """The SDK's gRPC ``ModelInfer`` on ``--grpc-port`` (rows without nulls: gRPC tensors have none)."""
    _, pyfunc, rows = registered
    rows = rows.dropna().head(20)

    async def call():
        client = InferenceGRPCClient(f"127.0.0.1:{server.grpc_port}", retries=2)
        try:
            return await client.infer(table_request(rows, MODEL))
        finally:
            await client.close()
    served = response_table(asyncio.run(call()))
    pd.testing.assert_frame_equal(served, pyfunc.predict(rows).reset_index(drop=True), check_dtype=False)


def test_a_downloaded_model_folder_serves_the_same_answers(registered, tmp_path):
    """``--model-dir``: the storage initializer's ``/mnt/models`` (the version's folder, downloaded) through the same
    predictor, called as the SDK's data plane calls it."""
    version, pyfunc, rows = registered
    folder = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{MODEL}/{version}", dst_path=str(tmp_path))
    predictor = KfloopPredictor(MODEL, ModelSource(model_name=MODEL, model_dir=folder))
    assert predictor.load() and predictor.ready
    served = response_table(predictor.predict(table_request(rows.head(50), MODEL)))
    pd.testing.assert_frame_equal(served, pyfunc.predict(rows.head(50)), check_dtype=False)


def test_error_mode_refuses_rows_outside_the_schema_with_400(registered, server):
    rows = registered[2].head(3).assign(region="atlantis")
    status, body = _post(f"{server}/v2/models/{MODEL}/infer", _table_body(rows, on_schema_violation="error"))
    assert status == 400 and "outside the model's training schema" in body["error"]


@pytest.mark.parametrize("change, status, words", [
    (lambda body: body["parameters"].pop("content_type"), 400, "parameters.content_type=None"),
    (lambda body: body["inputs"][0]["data"].pop(), 400, "columns of equal length"),
    (lambda body: body["parameters"].update(on_schema_violation="loud"), 400, "on_schema_violation='loud'"),
    (lambda body: body.pop("inputs"), 422, "Field required"),  # FastAPI's own check of the v2 body
])
def test_bad_requests_get_the_sdks_4xx(registered, server, change, status, words):
    body = _table_body(registered[2].head(4))
    change(body)
    answered, answer = _post(f"{server}/v2/models/{MODEL}/infer", body)
    assert answered == status and words in json.dumps(answer), answer


def test_more_rows_than_the_serving_limit_are_refused_before_scoring(server):
    rows = DEFAULT_LIMITS.max_rows + 1
    body = {"inputs": [{"name": "age", "shape": [rows], "datatype": "INT64", "data": [30] * rows}],
            "parameters": {"content_type": "pd"}}
    status, answer = _post(f"{server}/v2/models/{MODEL}/infer", body)
    assert status == 400 and f"max_rows={DEFAULT_LIMITS.max_rows}" in answer["error"]


def test_v1_requests_and_unknown_models_are_refused(server, registered):
    status, answer = _post(f"{server}/v1/models/{MODEL}:predict", {"instances": [[1, 2]]})
    assert status == 400 and "Open Inference Protocol v2" in answer["error"]
    status, _ = _post(f"{server}/v2/models/other/infer", _table_body(registered[2].head(2)))
    assert status == 404
    assert _status(f"{server}/v2/models/other/ready") == 404
