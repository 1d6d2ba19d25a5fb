"""Data in object storage: validate, train, drift and MLflow artifacts against a real S3 API server (moto_server).

Every test checks that the dummy key pair in the environment never reaches output, lineage or MLflow params.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import mlflow
import pytest

from data import storage
from mlflow_server import free_port
from s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Server
from training.fileio import file_digest
from training.validation import DataFileError, ReadLimits, load_schema, read_table, read_table_source

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "data" / "schema.yaml"
SECRETS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"credential {secret[:6]}... leaked into: {text[-500:]}"


def upload(bucket: str, key: str, path: Path) -> str:
    boto3.client("s3").upload_file(str(path), bucket, key)
    return f"s3://{bucket}/{key}"


def kfloop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process, with the current environment (plus ``env``)."""
    return subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


# ---------------------------------------------------------------------------------------------------- URIs

@pytest.mark.parametrize("uri, recorded", [
    ("s3://AKIA:secret@bucket/data/x.parquet", "s3://bucket/data/x.parquet"),
    ("s3://bucket/x.csv?X-Amz-Credential=AKIA&X-Amz-Signature=abc", "s3://bucket/x.csv"),
    ("az://container/x.parquet?sv=2024&sig=SAS#frag", "az://container/x.parquet"),
    ("gs://bucket/x.parquet", "gs://bucket/x.parquet"),
    ("/mnt/pvc/data/x.parquet", "/mnt/pvc/data/x.parquet"),
    ("relative/x.csv", "relative/x.csv"),
])
def test_redact_drops_user_info_and_query(uri, recorded):
    assert storage.redact(uri) == recorded


def test_remote_schemes_and_local_paths():
    assert [storage.is_remote(u) for u in ("s3://b/k", "gs://b/k", "az://c/k", "abfs://c/k", "/tmp/k", "k.csv")] \
        == [True, True, True, True, False, False]
    assert storage.record_uri("x.csv") == str(Path("x.csv").resolve())


# ---------------------------------------------------------------------------------------------------- reading

def test_read_from_s3_matches_local_with_md5_and_etag(s3_bucket, demo_files, tmp_path):
    local = demo_files["train.parquet"]
    uri = upload(s3_bucket, "data/train.parquet", local)
    df, source = read_table_source(uri)
    assert df.equals(read_table(local))
    assert source.uri == uri and source.md5 == file_digest(local, "md5")
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="data/train.parquet")
    assert source.version == head["ETag"].strip('"')
    csv = tmp_path / "train.csv"
    df.to_csv(csv, index=False)
    from_csv, csv_source = read_table_source(upload(s3_bucket, "data/train.csv", csv))
    assert len(from_csv) == len(df) and csv_source.md5 == file_digest(csv, "md5")


def test_versioned_bucket_records_the_version_id(s3_bucket, demo_files):
    client = boto3.client("s3")
    client.put_bucket_versioning(Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    uri = upload(s3_bucket, "v/train.parquet", demo_files["train.parquet"])
    version_id = client.head_object(Bucket=s3_bucket, Key="v/train.parquet")["VersionId"]
    assert read_table_source(uri)[1].version == version_id


def test_size_limit_is_checked_before_download(s3_bucket, demo_files):
    uri = upload(s3_bucket, "big/train.parquet", demo_files["train.parquet"])
    with pytest.raises(DataFileError, match=r"over the limit of 100: split the data") as info:
        read_table(uri, limits=ReadLimits(max_bytes=100))
    assert info.value.path == uri


def test_broken_object_is_named_by_its_uri(s3_bucket, tmp_path):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    uri = upload(s3_bucket, "bad/broken.parquet", bad)
    with pytest.raises(DataFileError, match="truncated Parquet") as info:
        read_table(uri)
    assert info.value.path == uri


def test_schema_from_s3(s3_bucket):
    uri = upload(s3_bucket, "schemas/schema.yaml", SCHEMA)
    assert load_schema(uri).columns.keys() == load_schema(SCHEMA).columns.keys()
    with pytest.raises(DataFileError, match="schema not found") as info:
        load_schema(f"s3://{s3_bucket}/schemas/missing.yaml")
    assert info.value.path == f"s3://{s3_bucket}/schemas/missing.yaml"


def test_credentials_in_a_uri_are_refused_without_echoing_them(s3_bucket, demo_files):
    upload(s3_bucket, "c/train.parquet", demo_files["train.parquet"])
    with pytest.raises(DataFileError, match="credentials in the URI") as info:
        read_table(f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@{s3_bucket}/c/train.parquet")
    assert_no_secret(str(info.value))


# ---------------------------------------------------------------------------------------------------- the CLI

def test_cli_validate_data_and_schema_in_s3(s3_bucket, demo_files):
    data = upload(s3_bucket, "cli/train.parquet", demo_files["train.parquet"])
    schema = upload(s3_bucket, "cli/schema.yaml", SCHEMA)
    done = kfloop("validate", "--data", data, "--schema", schema)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{data}: valid against {schema}"
    assert_no_secret(done.stdout, done.stderr)


def test_cli_validate_reports_failures_naming_the_uri(s3_bucket, demo_files, tmp_path):
    import pandas as pd

    df = pd.read_parquet(demo_files["train.parquet"])
    df.loc[df.index[:3], "age"] = 500
    bad = tmp_path / "bad.parquet"
    df.to_parquet(bad)
    data = upload(s3_bucket, "cli/bad.parquet", bad)
    done = kfloop("validate", "--data", data, "--schema", str(SCHEMA))
    assert done.returncode == 1
    assert f"{data}: column 'age' failed in_range" in done.stderr
    assert_no_secret(done.stdout, done.stderr)


def _failing_validate(uri: str, env: dict[str, str] | None = None) -> str:
    done = kfloop("validate", "--data", uri, "--schema", str(SCHEMA), env=env)
    assert done.returncode != 0
    assert_no_secret(done.stdout, done.stderr)
    return done.stderr


def test_missing_object_fails_naming_its_uri(s3_bucket):
    uri = f"s3://{s3_bucket}/nowhere/train.parquet"
    assert f"{uri}: not found" in _failing_validate(uri)


def test_missing_bucket_fails_naming_its_uri(s3_bucket):
    uri = f"s3://{s3_bucket}-absent/train.parquet"
    assert f"{uri}: not found" in _failing_validate(uri)


def test_no_credentials_fails_naming_the_uri_and_the_variables(s3_bucket, demo_files, tmp_path):
    uri = upload(s3_bucket, "nocreds/train.parquet", demo_files["train.parquet"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"], AWS_EC2_METADATA_DISABLED="true",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "pipelines", "validate", "--data", uri, "--schema", str(SCHEMA)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert f"{uri}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in done.stderr


def test_unreachable_endpoint_fails_naming_the_uri_and_endpoint(s3_bucket):
    closed = f"http://127.0.0.1:{free_port()}"
    uri = f"s3://{s3_bucket}/train.parquet"
    err = _failing_validate(uri, env={"AWS_ENDPOINT_URL": closed})
    assert f"{uri}: cannot reach the endpoint {closed}" in err


def test_access_denied_fails_naming_the_uri(tmp_path, monkeypatch):
    """A server that checks signatures and knows none of our keys answers 403."""
    server = S3Server(root=tmp_path, authenticate=True).start()
    try:
        uri = "s3://locked-bucket/train.parquet"
        err = _failing_validate(uri, env=server.env())
        assert f"{uri}: access denied" in err
    finally:
        server.stop()
