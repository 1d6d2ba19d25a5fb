"""Inference logs (monitoring/inference_logs.py): KServe's payload-logger format, read back as served rows, and the
drift check on them (issue 42 item 4)."""
from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from cli_run import cli
from monitoring.inference_logs import (REQUEST_TYPE, RESPONSE_TYPE, InferenceLogError, InferenceLogWriter, LogRecord,
                                       decode_table, read_inference_logs, records_from_blob,
                                       write_partitioned)
from monitoring.steps.checks import drift_step
from training.serving import MODEL_NAME_ANNOTATION, MODEL_VERSION_ANNOTATION
from training.serving.table import table_request

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "schema.yaml"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


def v2_request(rows: pd.DataFrame) -> dict:
    """``rows`` as the JSON body a v2 client sends for them."""
    return table_request(rows, "churn").to_rest()[0]


def v2_response(predictions: list) -> dict:
    return {"model_name": "churn", "outputs": [
        {"name": "prediction", "shape": [len(predictions)], "datatype": "INT64", "data": predictions},
        {"name": "schema_violations", "shape": [len(predictions)], "datatype": "BYTES",
         "data": [""] * len(predictions)}]}


def test_a_blob_is_what_kserves_json_marshaller_writes(tmp_path):
    """types.go 24-40 marshalled by encoding/json (marshaller_json.go 67-69): the payload base64, empty fields
    omitted; the key of store.go 165-208."""
    body = json.dumps(v2_request(pd.DataFrame({"age": [30]}))).encode()
    record = LogRecord(id="abc", type=REQUEST_TYPE, body=body, time=NOW + timedelta(microseconds=120),
                       inference_service="churn", namespace="ml", component="predictor", endpoint="canary",
                       annotations={MODEL_VERSION_ANNOTATION: "3"})
    blob = json.loads(record.blob())
    assert blob == {"bytes": base64.b64encode(body).decode(), "contentType": "application/json",
                    "reqType": "org.kubeflow.serving.inference.request", "id": "abc", "inferenceService": "churn",
                    "namespace": "ml", "component": "predictor", "endpoint": "canary",
                    "annotations": {MODEL_VERSION_ANNOTATION: "3"}, "occurrenceTime": "2026-12-06T12:00:00.00012Z"}
    assert record.key("logs") == "ml/churn/predictor/logs/abc-request.json"
    assert records_from_blob(record.blob(), "x") == [record]
    batch = b"[" + record.blob() + b"," + record.blob() + b"]"  # a batch of the agent's --log-batch-size
    assert records_from_blob(batch, "x") == [record, record]


def test_the_reader_joins_by_id_and_tolerates_dropped_reordered_and_lone_events(tmp_path):
    writer = InferenceLogWriter(tmp_path, namespace="ml", inference_service="churn")
    rows = pd.DataFrame({"age": [30, 40], "region": ["east", None]})
    at = NOW - timedelta(hours=1)
    # answered: the response written before the request (unordered delivery)
    writer.write(LogRecord(id="r1", type=RESPONSE_TYPE, body=json.dumps(v2_response([0, 1])).encode(),
                           time=at + timedelta(seconds=1), annotations={MODEL_VERSION_ANNOTATION: "2"}))
    writer.write(LogRecord(id="r1", type=REQUEST_TYPE, body=json.dumps(v2_request(rows)).encode(), time=at,
                           annotations={MODEL_NAME_ANNOTATION: "churn", MODEL_VERSION_ANNOTATION: "2"}))
    writer.log("r0", v2_request(rows.iloc[:1]), None, model="churn", version=3,
               received=at - timedelta(minutes=5))  # the model failed: no response
    writer.write(LogRecord(id="lost", type=RESPONSE_TYPE, body=json.dumps(v2_response([1])).encode(), time=at))
    writer.log("old", v2_request(rows), v2_response([1, 1]), model="churn", version=1,
               received=NOW - timedelta(days=3), answered=NOW - timedelta(days=3))

    served = read_inference_logs(tmp_path, since=timedelta(hours=24), now=NOW)
    counts = ("blobs", "requests", "responses", "request_only", "response_only", "duplicates")
    assert len(served.rows) == 3 and {k: getattr(served, k) for k in counts} == {
        "blobs": 6, "requests": 2, "responses": 2, "request_only": 1, "response_only": 1, "duplicates": 0}
    got = served.rows
    assert list(got["request_id"]) == ["r0", "r1", "r1"], "in request time order"
    assert list(got["model_version"]) == ["3", "2", "2"] and list(got["age"]) == [30, 30, 40]
    assert got["prediction"].isna().tolist() == [True, False, False] and list(got["prediction"][1:]) == [0, 1]
    assert got["region"].tolist() == ["east", "east", None]

    written = write_partitioned(got, tmp_path / "out")
    assert sorted(Path(p).relative_to(tmp_path / "out").parent.as_posix() for p in written) == [
        "date=2026-12-06/model_version=2", "date=2026-12-06/model_version=3"]
    back = pd.read_parquet(tmp_path / "out")
    assert sorted(back["request_id"]) == ["r0", "r1", "r1"] and not list((tmp_path / "out").rglob(".*.tmp"))


@pytest.mark.parametrize("case, blob, words", [
    ("not JSON", b"{", ["blob", "not JSON"]),
    ("base64", json.dumps({"id": "a", "reqType": REQUEST_TYPE, "bytes": "%%%",
                           "occurrenceTime": "2026-12-06T11:00:00Z"}).encode(), ["bytes", "'%%%'", "base64"]),
    ("time", json.dumps({"id": "a", "reqType": REQUEST_TYPE, "bytes": "",
                         "occurrenceTime": "yesterday"}).encode(), ["occurrenceTime", "'yesterday'"]),
    ("datatype", LogRecord(id="a", type=REQUEST_TYPE, time=NOW - timedelta(hours=1), body=json.dumps(
        {"inputs": [{"name": "age", "shape": [1], "datatype": "INT64", "data": ["old"]}]}).encode()).blob(),
     ["inputs[0] ('age', INT64).data", "'old'"]),
    ("shape", LogRecord(id="a", type=REQUEST_TYPE, time=NOW - timedelta(hours=1), body=json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]}]}).encode()).blob(),
     ["inputs[0].shape", "[1, 2]", "content_type: pd"]),
])
def test_an_unreadable_record_is_named_with_its_field_and_value(tmp_path, case, blob, words):
    path = tmp_path / "ml" / "a-request.json"
    path.parent.mkdir()
    path.write_bytes(blob)
    with pytest.raises(InferenceLogError) as error:
        read_inference_logs(tmp_path, since=timedelta(hours=24), now=NOW)
    message = str(error.value)
    assert all(word in message for word in words), (case, message)
    if case in ("not JSON", "base64", "time"):
        assert str(path) in message, (case, message)


def test_a_table_encoded_as_a_v2_request_decodes_to_the_same_table(demo_files):
    rows = pd.read_parquet(demo_files["batch_stable.parquet"]).head(300)
    rows.loc[3, "age"] = None  # an integer column with a null comes back as Parquet reads it: float
    back = decode_table(json.dumps(v2_request(rows)).encode(), "inputs", "x")
    pd.testing.assert_frame_equal(back, rows.astype({"age": "float64"}))
    with pytest.raises(ValueError, match="column 'when'"):
        v2_request(pd.DataFrame({"when": pd.to_datetime(["2026-12-06"])}))


def test_logs_in_object_storage(s3_bucket):
    writer = InferenceLogWriter(f"s3://{s3_bucket}/logs", path="kfloop", namespace="ml", inference_service="churn")
    writer.log("r1", v2_request(pd.DataFrame({"age": [30, 31]})), v2_response([0, 1]), model="churn", version=4)
    served = read_inference_logs(f"s3://{s3_bucket}/logs", since=timedelta(minutes=5))
    assert served.requests == 1 and list(served.rows["prediction"]) == [0, 1]
    [part] = write_partitioned(served.rows, f"s3://{s3_bucket}/served")
    assert "/model_version=4/" in part and list(pd.read_parquet(part)["age"]) == [30, 31]


def test_drift_on_logged_requests_equals_drift_on_the_table(tmp_path, demo_files, capsys):
    """The Done-when: the drifted batch sent as requests of 40 rows, logged and read back, gives the verdict and
    statistics of the same rows read from the table."""
    table = demo_files["batch_drifted.parquet"]
    rows = pd.read_parquet(table)
    writer = InferenceLogWriter(tmp_path / "logs", namespace="ml", inference_service="churn")
    for start in range(0, len(rows), 40):
        part = rows.iloc[start:start + 40]
        writer.log(None, v2_request(part), v2_response([0] * len(part)), model="churn", version=1,
                   received=datetime.now(timezone.utc) - timedelta(minutes=60 - start / 1000))
    check = dict(reference_uri=str(demo_files["train.parquet"]), schema_uri=str(SCHEMA), model_name="", policy={},
                 report_out="")
    from_table = drift_step(current_uri=str(table), **check)
    from_logs = drift_step(current_uri="", current_logs_uri=str(tmp_path / "logs"), since="2h", **check)
    assert from_table.drift.drifted is True
    assert from_logs.drift.to_dict() == from_table.drift.to_dict(), "verdict, share, per-column scores, outside"
    assert from_logs.current_uri == f"{tmp_path / 'logs'} (since 2h)"

    code, out, err = cli(capsys, "drift", "--current-logs", str(tmp_path / "logs"), "--since", "2h", "--reference",
                         str(demo_files["train.parquet"]), "--schema", str(SCHEMA), "--json")
    assert code == 0, err
    assert json.loads(out)["drifted"] is True
    assert json.loads(out)["share_drifted_columns"] == from_table.drift.share_drifted_columns
    code, out, err = cli(capsys, "drift", "--current-logs", str(tmp_path / "logs"), "--since", "1s", "--reference",
                         str(demo_files["train.parquet"]), "--json")
    assert code != 0 and "no request logged in the last 1s" in err


def test_the_drift_pipeline_reads_the_logged_window(tmp_path, demo_files, isolated_env):
    """kfp.local: ``current_logs_uri`` as the drift pipeline's current batch, ``drift.logs_since`` its window; a
    retraining needs ``retrain_uri`` (the served rows hold no target)."""
    from pipelines.local.runner import PipelineFailed
    from pipelines.local.runs import run_pipeline

    rows = pd.read_parquet(demo_files["batch_stable.parquet"])
    writer = InferenceLogWriter(tmp_path / "logs")
    for start in range(0, len(rows), 100):
        writer.log(None, v2_request(rows.iloc[start:start + 100]), None, model="churn", version=1)
    settings = {"current_logs_uri": str(tmp_path / "logs"), "reference_uri": str(demo_files["train.parquet"]),
                "schema_uri": str(SCHEMA), "model_name": "served", "drift": {"logs_since": "1h"}}
    with pytest.raises(PipelineFailed, match="set retrain_uri"):
        run_pipeline("drift", settings, env=isolated_env, quiet=True)
    summary = run_pipeline("drift", {**settings, "retrain_uri": str(demo_files["train.parquet"])},
                           env=isolated_env, quiet=True)
    assert summary["drifted"] is False, summary
