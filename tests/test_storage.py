"""Data in object storage: validate, train, drift and MLflow artifacts against a real S3 API server (moto_server).

Every test checks that the dummy key pair in the environment never reaches output, lineage or MLflow params.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import mlflow
import pytest

from data import storage
from data.errors import EXIT_DATA_FILE
from data.fileio import file_digest
from data.tables import DataFileError, ReadLimits, read_table, read_table_source
from data.validation import load_schema
from cluster.s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Server
from cluster.server_process import free_port
from training.model_files import MODEL_FILE

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


def kfloop(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process in ``cwd``, with the current environment (plus ``env``)."""
    return subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


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


@pytest.mark.parametrize("uri, rule", [
    ("http://alice:S3CRETPW@127.0.0.1:1/x.parquet", "rule uri.scheme: scheme 'http'"),
    ("https://bucket.s3.amazonaws.com/x.parquet?X-Amz-Signature=abc123SIG", "rule uri.scheme: scheme 'https'"),
    ("ftp://127.0.0.1/x.csv", "rule uri.scheme: scheme 'ftp'"),
    ("file:///var/run/secrets/kubernetes.io/serviceaccount/token", "rule uri.scheme: scheme 'file'"),
    ("memory://x.parquet", "rule uri.scheme: scheme 'memory'"),
    ("simplecache::s3://bucket/x.parquet", "rule uri.chain"),
    ("s3://ml-data/scratch/../churn/x.parquet", "rule uri.key"),
    ("s3://ml-data/./churn/x.parquet", "rule uri.key"),
    ("s3://ml-data/churn//x.parquet", "rule uri.key"),
    ("s3://ml-data//x.parquet", "rule uri.key"),
    ("s3://ml-data/x.parquet?X-Amz-Credential=AKIA&X-Amz-Signature=abc123SIG", "rule uri.query"),
    ("az://container/x.parquet#frag", "rule uri.query"),
])
def test_only_local_paths_and_object_stores_are_read_and_odd_keys_are_refused_not_resolved(uri, rule):
    for call in (storage.check_uri, storage.resolve, storage.location):
        with pytest.raises(storage.StorageError, match=re.escape(rule)) as err:
            call(uri)
        assert storage.redact(uri) in str(err.value)
        assert not any(secret in str(err.value) for secret in ("S3CRETPW", "abc123SIG", "AKIA"))


def test_allowed_prefixes_compare_object_keys_as_given_and_local_paths_by_realpath(tmp_path):
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    allowed.mkdir(), elsewhere.mkdir()
    (allowed / "link.parquet").symlink_to(elsewhere / "x.parquet")
    assert storage.under_prefix("s3://ml-data/churn/x.parquet", "s3://ml-data/churn/")
    assert not storage.under_prefix("s3://ml-data/churn-evil/x.parquet", "s3://ml-data/churn")
    assert storage.under_prefix(str(allowed / "x.parquet"), str(allowed))
    assert not storage.under_prefix(str(allowed / "link.parquet"), str(allowed))  # abspath would let it pass
    assert not storage.under_prefix(f"{allowed}/../elsewhere/x.parquet", str(allowed))


@pytest.mark.parametrize("data_uri, folder", [("/train.parquet", "(/)"),
                                              ("s3://bucket/train.parquet", "(s3://bucket)")])
def test_a_data_folder_of_root_or_a_bare_bucket_is_refused_as_an_allowed_prefix(data_uri, folder):
    with pytest.raises(storage.StorageError, match=re.escape(f"rule trigger.allowed_data_prefixes: the folder of "
                                                             f"this data {folder} would allow every file there")):
        storage.data_folder(data_uri)
    assert storage.data_folder("s3://bucket/churn/train.parquet") == "s3://bucket/churn"


def test_remote_schemes_and_local_paths():
    assert [storage.is_remote(u) for u in ("s3://b/k", "gs://b/k", "az://c/k", "abfs://c/k", "/tmp/k", "k.csv")] \
        == [True, True, True, True, False, False]
    assert storage.record_uri("x.csv") == str(Path("x.csv").resolve())


@pytest.mark.parametrize("uri, package, extra", [("gs://bucket/train.parquet", "gcsfs", "gcs"),
                                                 ("az://container/train.parquet", "adlfs", "azure")])
def test_a_store_whose_package_is_missing_names_the_extra(uri, package, extra):
    try:
        __import__(package)
    except ImportError:
        with pytest.raises(DataFileError, match=rf"{uri}: reading this URI needs the {package} package: "
                                                rf"pip install 'kfloop\[{extra}\]'"):
            read_table(uri)
    else:
        pytest.skip(f"{package} is installed here")


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


@pytest.mark.parametrize("uri, shown", [
    (f"s3://{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}@bucket/train.parquet", "s3://***@bucket/train.parquet"),
    (f"s3://bucket/train.parquet?X-Amz-Credential={ACCESS_KEY_ID}&X-Amz-Signature={SECRET_ACCESS_KEY}",
     "s3://bucket/train.parquet"),
])
def test_pipeline_parameters_refuse_credentials_in_a_uri(uri, shown):
    from pipelines.config import pipeline_params
    from pipelines.training import training_pipeline

    refused = rf"\['dataset_uri'\]: a credential in a run parameter \({re.escape(shown)}\)"
    with pytest.raises(ValueError, match=refused) as info:
        pipeline_params(training_pipeline, {"dataset_uri": uri})
    assert_no_secret(str(info.value))


# ---------------------------------------------------------------------------------------------------- the CLI

def test_cli_validate_data_and_schema_in_s3(s3_bucket, demo_files, tmp_path):
    data = upload(s3_bucket, "cli/train.parquet", demo_files["train.parquet"])
    schema = upload(s3_bucket, "cli/schema.yaml", SCHEMA)
    done = kfloop(tmp_path, "validate", "--data", data, "--schema", schema)
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
    done = kfloop(tmp_path, "validate", "--data", data, "--schema", str(SCHEMA))
    assert done.returncode == 1
    assert f"{data}: column 'age' failed in_range" in done.stderr
    assert_no_secret(done.stdout, done.stderr)


def _failing_validate(cwd: Path, uri: str, env: dict[str, str] | None = None) -> str:
    done = kfloop(cwd, "validate", "--data", uri, "--schema", str(SCHEMA), env=env)
    assert done.returncode == EXIT_DATA_FILE, done.stderr
    assert_no_secret(done.stdout, done.stderr)
    return done.stderr


def test_missing_object_fails_naming_its_uri(s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/nowhere/train.parquet"
    assert f"{uri}: not found" in _failing_validate(tmp_path, uri)


def test_missing_bucket_fails_naming_its_uri(s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}-absent/train.parquet"
    assert f"{uri}: not found" in _failing_validate(tmp_path, uri)


def test_no_credentials_fails_naming_the_uri_and_the_variables(s3_bucket, demo_files, tmp_path):
    uri = upload(s3_bucket, "nocreds/train.parquet", demo_files["train.parquet"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"], AWS_EC2_METADATA_DISABLED="true",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "pipelines", "validate", "--data", uri, "--schema", str(SCHEMA)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == EXIT_DATA_FILE, done.stderr
    assert f"{uri}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in done.stderr


def test_unreachable_endpoint_fails_naming_the_uri_and_endpoint(s3_bucket, tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    uri = f"s3://{s3_bucket}/train.parquet"
    err = _failing_validate(tmp_path, uri, env={"AWS_ENDPOINT_URL": closed})
    assert f"{uri}: cannot reach the endpoint {closed}" in err


def test_access_denied_fails_naming_the_uri(tmp_path):
    """A server that checks signatures and knows none of our keys answers 403."""
    server = S3Server(root=tmp_path, authenticate=True).start()
    try:
        uri = "s3://locked-bucket/train.parquet"
        err = _failing_validate(tmp_path, uri, env=server.env())
        assert f"{uri}: access denied" in err
    finally:
        server.stop()


def test_torchrun_ranks_read_training_data_and_schema_from_s3(s3_bucket, demo_files, tmp_path, monkeypatch):
    """``kfloop train`` runs training.train under torchrun (2 processes); every rank reads the data from S3."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = upload(s3_bucket, "train/train.parquet", demo_files["train.parquet"])
    schema = upload(s3_bucket, "train/schema.yaml", SCHEMA)
    done = kfloop(tmp_path, "--workdir", str(tmp_path / "workdir"), "train", "--data", data, "--schema", schema,
                  "--nnodes", "1", "--nproc-per-node", "2", "--model-dir", str(tmp_path / "model"),
                  "--set", "training.epochs=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "model" / MODEL_FILE).read_text())["world_size"] == 2
    assert_no_secret(done.stdout, done.stderr)


def test_dvc_remote_in_s3_pushes_and_serves_the_data_by_md5(s3_bucket, demo_files, tmp_path):
    """A DVC repo whose remote is ``s3://``: ``dvc push`` the data, empty the cache, fetch it back by its md5."""
    import shutil

    from dvc.repo import Repo

    from training.reproduce import fetch_by_md5

    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(demo_files["train.parquet"], root / "train.parquet")
    with Repo.init(str(root), no_scm=True) as repo:
        with repo.config.edit("local") as conf:
            conf["remote"]["store"] = {"url": f"s3://{s3_bucket}/dvcstore"}
            conf["core"]["remote"] = "store"
        repo.add(str(root / "train.parquet"))
        assert repo.push() == 1
    md5 = file_digest(demo_files["train.parquet"], "md5")
    shutil.rmtree(root / ".dvc" / "cache")
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == [f"dvcstore/files/md5/{md5[:2]}/{md5[2:]}"]
    path, source = fetch_by_md5(md5, tmp_path / "out" / "train.parquet", repo_root=root)
    assert file_digest(path, "md5") == md5 and source.startswith("DVC remote 'store'")
    assert_no_secret(source)


# ---------------------------------------------------------------------------------------------------- the pipelines

MODEL = "s3-loop"
FAST = ["--set", "training.epochs=2", "--set", "nproc_per_node=1"]


@pytest.fixture(scope="module")
def s3_loop(s3_server, tmp_path_factory):
    """Data and schema in S3, and an ``mlflow server`` whose artifacts live in S3 (``--artifacts-destination``)."""
    from cluster.mlflow_server import MlflowServer

    bucket = "kfloop-s3-loop"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        for key in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME", "KFLOOP_GIT_COMMIT", "AWS_SESSION_TOKEN"):
            mp.delenv(key, raising=False)
        boto3.client("s3").create_bucket(Bucket=bucket)
        server = MlflowServer(root=tmp_path_factory.mktemp("mlflow-s3"),
                              artifacts_destination=f"s3://{bucket}/mlartifacts").start()
        mp.setenv("MLFLOW_TRACKING_URI", server.url)
        try:
            yield {"bucket": bucket, "workdir": tmp_path_factory.mktemp("s3-loop") / "workdir"}
        finally:
            server.stop()


@pytest.fixture(scope="module")
def s3_champion(s3_loop, demo_files) -> tuple[str, subprocess.CompletedProcess]:
    """``kfloop run training --local`` on data and schema in S3: the data URI and the finished CLI process."""
    bucket, workdir = s3_loop["bucket"], s3_loop["workdir"]
    data = upload(bucket, "data/train.parquet", demo_files["train.parquet"])
    schema = upload(bucket, "data/schema.yaml", SCHEMA)
    done = kfloop(workdir.parent, "--workdir", str(workdir), "run", "training", "--local", "--json",
                  "--set", f"dataset_uri={data}", "--set", f"schema_uri={schema}", "--set", f"model_name={MODEL}",
                  *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    return data, done


def test_training_pipeline_with_data_and_artifacts_in_s3(s3_loop, s3_champion, demo_files):
    bucket = s3_loop["bucket"]
    data, done = s3_champion
    summary = json.loads(done.stdout)
    assert summary["promoted"] is True and summary["champion_version"] == "1"
    assert_no_secret(done.stdout, done.stderr)

    client = mlflow.MlflowClient()
    version = client.get_model_version(MODEL, "1")
    head = boto3.client("s3").head_object(Bucket=bucket, Key="data/train.parquet")
    assert version.tags["data_uri"] == data
    assert version.tags["data_md5"] == file_digest(demo_files["train.parquet"], "md5")
    assert version.tags["data_version"] == head["ETag"].strip('"')
    run = client.get_run(version.run_id)
    assert_no_secret(json.dumps(version.tags), json.dumps(run.data.params), json.dumps(run.data.tags))
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="mlartifacts/")["Contents"]]
    assert any(k.endswith("weights.safetensors") for k in keys), keys
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    raw = read_table(data).drop(columns=["churned"]).head(5)
    assert len(champion.predict(raw)) == 5


def test_drift_with_current_and_reference_in_s3(s3_loop, demo_files):
    bucket = s3_loop["bucket"]
    reference = upload(bucket, "drift/train.parquet", demo_files["train.parquet"])
    drifted = upload(bucket, "drift/batch.parquet", demo_files["batch_drifted.parquet"])
    schema = upload(bucket, "drift/schema.yaml", SCHEMA)
    workdir = s3_loop["workdir"]
    done = kfloop(workdir.parent, "--workdir", str(workdir), "drift", "--reference", reference, "--current", drifted,
                  "--schema", schema, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["drifted"] is True and result["reference_uri"] == reference
    assert result["data_md5"] == file_digest(demo_files["batch_drifted.parquet"], "md5") and result["data_version"]
    assert_no_secret(done.stdout, done.stderr)


def test_missing_dataset_fails_the_run_and_leaves_the_registry_alone(s3_loop, s3_champion):
    client = mlflow.MlflowClient()
    before = sorted(v.version for v in client.search_model_versions(f"name='{MODEL}'"))
    champion = client.get_model_version_by_alias(MODEL, "champion").version
    uri = f"s3://{s3_loop['bucket']}/data/gone.parquet"
    workdir = s3_loop["workdir"]
    done = kfloop(workdir.parent, "--workdir", str(workdir), "run", "training", "--local", "--set",
                  f"dataset_uri={uri}", "--set", f"model_name={MODEL}", *FAST)
    assert done.returncode == EXIT_DATA_FILE, done.stderr[-3000:]
    assert f"{uri}: not found" in done.stderr
    assert_no_secret(done.stdout, done.stderr)
    assert sorted(v.version for v in client.search_model_versions(f"name='{MODEL}'")) == before
    assert client.get_model_version_by_alias(MODEL, "champion").version == champion


def test_no_reader_leaks_a_secret_of_the_endpoint_or_the_uri(s3_loop, s3_champion, s3_server, tmp_path):
    """Every reader, as a CLI process with full tracebacks (``--debug``), fails on an endpoint and URIs that carry a
    made-up secret (``user:secret@``, a signed query): it is in no output, file of the workdir, MLflow param, tag or
    artifact."""
    secret = "s3cr3t-XYZ-d41f"
    bucket, workdir = s3_loop["bucket"], s3_loop["workdir"]
    leaky = s3_server.url.replace("http://", f"http://kfloop:{secret}@")  # the real server, user info in the URL
    closed = f"http://kfloop:{secret}@127.0.0.1:{free_port()}"
    gone = f"s3://{bucket}/data/gone.parquet?X-Amz-Signature={secret}"
    data = f"s3://{bucket}/data/train.parquet"
    cli = ["--debug", "--workdir", str(workdir)]
    runs = {
        "validate, signed URI": (["validate", "--data", gone, "--schema", str(SCHEMA)], leaky),
        "validate, user info": (["validate", "--data", data.replace("s3://", f"s3://kfloop:{secret}@"), "--schema",
                                 str(SCHEMA)], leaky),
        "train": (["train", "--data", data, "--schema", str(SCHEMA), "--nproc-per-node", "1",
                   "--model-dir", str(tmp_path / "model")], closed),
        "drift": (["drift", "--reference", data, "--current", gone, "--schema", str(SCHEMA)], leaky),
        "quality": (["quality", "--model", MODEL, "--data", gone], leaky),
    }
    for name, (args, endpoint) in runs.items():
        done = kfloop(workdir.parent, *cli, *args, env={"AWS_ENDPOINT_URL": endpoint,
                                                         "MLFLOW_S3_ENDPOINT_URL": endpoint})
        assert done.returncode != 0, f"{name} did not fail: {done.stdout[-2000:]}"
        assert secret not in done.stdout + done.stderr, f"{name} printed the secret: {done.stderr[-3000:]}"
        assert f"s3://{bucket}/data/" in done.stderr, f"{name} failed elsewhere: {done.stderr[-3000:]}"

    for path in workdir.parent.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"{path} holds the secret"
    client = mlflow.MlflowClient()
    runs_seen = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert runs_seen  # the champion's
    for run in runs_seen:
        assert secret not in json.dumps({"params": run.data.params, "tags": run.data.tags}), run.info.run_id
        local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, dst_path=str(tmp_path / run.info.run_id))
        for path in Path(local).rglob("*"):
            assert not path.is_file() or secret.encode() not in path.read_bytes(), f"artifact {path}"
    for version in client.search_model_versions(f"name='{MODEL}'"):
        assert secret not in json.dumps(version.tags) + (version.description or "")


def test_the_dvc_store_fails_without_the_secret_of_its_endpoint(tmp_path, monkeypatch):
    """Registration keeping the training data in an ``s3://`` data store (what reproduce reads back), its endpoint
    carrying a made-up secret: the whole traceback is clean."""
    import traceback

    from data.dvc_store import DataStoreConfig, keep

    secret = "s3cr3t-XYZ-7e02"
    for key, value in {"AWS_ENDPOINT_URL": f"http://kfloop:{secret}@127.0.0.1:{free_port()}",
                       "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    source = tmp_path / "train.csv"
    source.write_text("a,b\n1,2\n")
    with pytest.raises(Exception) as failed:
        keep(str(source), file_digest(source, "md5"), config=DataStoreConfig(remote="s3://kfloop-absent/store"),
             workdir=tmp_path, repo_root=None)
    text = "".join(traceback.format_exception(failed.value))
    assert secret not in text and "Traceback" in text
