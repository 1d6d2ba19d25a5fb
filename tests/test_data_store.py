"""Every version reproducible whatever its data source: registration keeps training data that DVC does not hold in
the data store (a DVC remote, data/dvc_store.py), and ``kfloop reproduce`` fetches it from there: for a plain file
outside any DVC repo and for an ``s3://`` object on moto_server, with the original gone."""
from __future__ import annotations

import json
import shutil
import subprocess

import boto3
import mlflow
import pandas as pd
import pytest
from cli_run import cli

from data.dvc_store import DataStoreConfig, DataStoreError, keep
from data.errors import EXIT_FAILED
from data.fileio import file_digest
from data.settings import CODE_ROOT
from pipelines.config import pipeline_params
from pipelines.training import training_pipeline

FAST = ["--set", "training.epochs=1", "--set", "nproc_per_node=1", "--set", "model.params.hidden=[8]",
        "--set", "target=churned"]


def _object(store, md5: str):
    return store / "files" / "md5" / md5[:2] / md5[2:]


@pytest.fixture
def own_data(tmp_path, demo_files):
    """A training file of the user's own, in tmp_path (outside any DVC repo): never added to DVC."""
    path = tmp_path / "mine" / "customers.parquet"
    path.parent.mkdir()
    pd.read_parquet(demo_files["train.parquet"]).head(900).to_parquet(path)
    return path


def test_keep_copies_data_dvc_does_not_hold_in_dvcs_layout_once(own_data, tmp_path, monkeypatch):
    """The copy is a DVC object: a DVC repo whose remote is the store pulls the file back with `dvc pull`."""
    from dvc.repo import Repo

    md5 = file_digest(own_data, "md5")
    store = tmp_path / "workdir" / "dvc-store"
    kept = keep(str(own_data), md5, config=DataStoreConfig(), workdir=tmp_path / "workdir", repo_root=CODE_ROOT)
    assert (kept.copied, kept.data_store, kept.location) == (True, str(store), f"data store {store}")
    assert _object(store, md5).read_bytes() == own_data.read_bytes()
    again = keep(str(own_data), md5, config=DataStoreConfig(), workdir=tmp_path / "workdir", repo_root=CODE_ROOT)
    assert (again.copied, again.data_store) == (False, str(store))

    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    repo_dir = tmp_path / "consumer"
    repo_dir.mkdir()
    shutil.copy(own_data, repo_dir / "customers.parquet")
    with Repo.init(str(repo_dir), no_scm=True) as repo:
        with repo.config.edit("local") as conf:
            conf["remote"]["store"] = {"url": str(store)}
            conf["core"]["remote"] = "store"
        repo.add(str(repo_dir / "customers.parquet"))
    (repo_dir / "customers.parquet").unlink()
    shutil.rmtree(repo_dir / ".dvc" / "cache")
    with Repo(str(repo_dir)) as repo:
        repo.pull()
    assert file_digest(repo_dir / "customers.parquet", "md5") == md5


def test_size_cap_refusal_names_the_file_its_size_and_the_setting(own_data, tmp_path):
    md5, size = file_digest(own_data, "md5"), own_data.stat().st_size
    with pytest.raises(DataStoreError) as refused:
        keep(str(own_data), md5, config=DataStoreConfig(max_bytes=size - 1), workdir=tmp_path / "w",
             repo_root=CODE_ROOT)
    message = str(refused.value)
    assert message.startswith(f"{own_data}: {size} bytes, over data_store.max_bytes={size - 1}: ")
    assert f"--set data_store.max_bytes={size}" in message and "dvc add" in message
    assert not _object(tmp_path / "w" / "dvc-store", md5).exists()


def test_data_that_changed_since_validation_is_not_kept(own_data, tmp_path):
    validated = "0" * 32
    with pytest.raises(DataStoreError, match=f"now hash to md5 {file_digest(own_data, 'md5')}, not the {validated}"):
        keep(str(own_data), validated, config=DataStoreConfig(), workdir=tmp_path / "w", repo_root=CODE_ROOT)
    store = tmp_path / "w" / "dvc-store"
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]  # no partial object


def test_a_data_store_that_cannot_be_written_is_named(own_data, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    store = tmp_path / "a-file" / "store"
    with pytest.raises(DataStoreError, match=f"^data store {store}: cannot write the training data .*check "
                                             "data_store.remote"):
        keep(str(own_data), file_digest(own_data, "md5"), config=DataStoreConfig(remote=str(store)),
             workdir=tmp_path / "w", repo_root=CODE_ROOT)


def test_a_failure_to_keep_the_data_registers_nothing(isolated_env, own_data, tmp_path):
    from training.steps.register import register_step

    with pytest.raises(DataStoreError, match="over data_store.max_bytes=10"):
        register_step(model_dir=str(tmp_path / "model"), report_path=str(tmp_path / "report.json"),
                      schema_path=str(tmp_path / "schema.yaml"), run_id="r", model_name="never",
                      dataset_uri=str(own_data), data_md5=file_digest(own_data, "md5"), holdout_sha256="0" * 64,
                      pipeline_run_id="p", champion_version="", holdout_fraction=0.2, split_seed=42,
                      data_store={"max_bytes": 10})
    assert mlflow.MlflowClient().search_registered_models() == []


@pytest.mark.parametrize("values, message", [
    ({"max_bytes": 0}, "data_store.max_bytes=0: use a positive number of bytes"),
    ({"max_bytes": True}, "true/false is not a valid"),
    ({"remote": "s3://key:secret@bucket/store"}, "data_store.remote=s3://bucket/store: credentials in the URL"),
    ({"remot": "/x"}, r"unknown data_store key\(s\) \['remot'\]"),
])
def test_data_store_settings_state_the_fix(values, message):
    with pytest.raises(ValueError, match=message):
        pipeline_params(training_pipeline, {"dataset_uri": "d.csv", "data_store": values})
    assert pipeline_params(training_pipeline, {"dataset_uri": "d.csv", "data_store": {"max_bytes": 5}})[
        "data_store_config"] == {"max_bytes": 5}


# ------------------------------------------------------------------------------------------ train, then reproduce

@pytest.fixture
def pinned_env(tmp_path, monkeypatch):
    """A fresh workdir; the code's commit pinned the way images pin it (KFLOOP_GIT_COMMIT), so reproduce accepts
    this checkout whatever its working tree holds."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=CODE_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    for key in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", head)
    yield tmp_path / "workdir"
    mlflow.set_tracking_uri(None)


def _train_then_reproduce(capsys, workdir, model: str, dataset_uri: str, *settings: str,
                          before_reproduce=lambda: None) -> dict:
    code, out, err = cli(capsys, "--workdir", str(workdir), "run", "training", "--local", "--json", "--set",
                          f"dataset_uri={dataset_uri}", "--set", f"model_name={model}", *FAST, *settings)
    assert code == 0, err[-3000:]
    assert json.loads(out)["model_version"] == "1"
    before_reproduce()
    code, out, err = cli(capsys, "reproduce", model, "1", "--json", "--workdir", str(workdir))
    assert code == 0, err[-3000:]
    return json.loads(out)


def test_reproduce_a_version_trained_from_a_plain_file_never_added_to_dvc(pinned_env, own_data, capsys):
    md5 = file_digest(own_data, "md5")
    original = own_data.read_bytes()
    result = _train_then_reproduce(capsys, pinned_env, "plain-file", str(own_data),
                                   before_reproduce=own_data.unlink)  # reproduce must not need the original
    store = (pinned_env / "dvc-store").resolve()
    assert result["identical"] is True and result["data_md5"] == md5
    assert result["data_source"] == f"data store {store} ({_object(store, md5)})"
    assert _object(store, md5).read_bytes() == original
    assert all(m["recorded"] == m["reproduced"] for m in result["metrics"].values())
    version = mlflow.MlflowClient().get_model_version("plain-file", "1")
    assert (version.tags["data_md5"], version.tags["data_store"]) == (md5, str(store))

    shutil.rmtree(store)  # gone: the refusal lists every place it looked
    code, _, err = cli(capsys, "--workdir", str(pinned_env), "reproduce", "plain-file", "1")
    assert code == EXIT_FAILED
    assert f"data md5 {md5} is in none of: DVC cache (" in err
    assert f"data store {store} ({_object(store, md5)}). Push the training data" in err


def test_reproduce_a_version_trained_from_s3_with_the_object_gone(pinned_env, own_data, s3_bucket, capsys):
    """The data store is an S3 remote (``data_store.remote``); reproduce finds it through the recorded lineage."""
    s3 = boto3.client("s3")
    s3.upload_file(str(own_data), s3_bucket, "incoming/customers.parquet")
    md5 = file_digest(own_data, "md5")
    store = f"s3://{s3_bucket}/dvcstore"
    result = _train_then_reproduce(
        capsys, pinned_env, "s3-file", f"s3://{s3_bucket}/incoming/customers.parquet",
        "--set", f"data_store.remote={store}",
        before_reproduce=lambda: s3.delete_object(Bucket=s3_bucket, Key="incoming/customers.parquet"))
    assert result["identical"] is True and result["data_md5"] == md5
    assert result["data_source"].startswith(f"data store {store} (")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == [f"dvcstore/files/md5/{md5[:2]}/{md5[2:]}"]
    assert not (pinned_env / "dvc-store").exists()  # the configured remote, not the workdir's
