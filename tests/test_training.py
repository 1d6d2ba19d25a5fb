"""TrainingConfig, and training.train under real torchrun: 2 local nodes x 2 gloo processes, resume, MLflow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from training import checkpoints
from training.config import JobShape, TrainingConfig
from training.launch.local import train_local
from training.model import MODEL_FILE, WEIGHTS_FILE, Predictor
from training.train import _join_attempt, param_digest
from data.validation import infer_schema, schema_to_yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = TrainingConfig(epochs=4, batch_size=64, model={"params": {"dropout": 0.1}})
SHAPE = JobShape(nnodes=2, nproc_per_node=2)
STEPS_PER_EPOCH = 10  # 3000 rows - 450 validation = 2550 -> 638 per rank -> 10 batches of 64


def make_frame(n_rows: int, seed: int) -> pd.DataFrame:
    """Customers with numeric, bool and categorical columns, some nulls, and a binary string label."""
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n_rows)
    score = rng.normal(0.0, 1.0, n_rows)
    visits = rng.poisson(3.0, n_rows)
    active = rng.random(n_rows) < 0.6
    plan = rng.choice(["basic", "plus", "pro"], n_rows, p=[0.5, 0.3, 0.2])
    region = rng.choice(["north", "south", "east", "west"], n_rows).astype(object)
    logit = 1.4 * score - 0.04 * (age - 45) + 1.0 * (plan == "basic") - 0.8 * active + 0.3 * (visits - 3)
    label = np.where(rng.random(n_rows) < 1 / (1 + np.exp(-logit)), "leave", "stay")
    score[rng.random(n_rows) < 0.05] = np.nan
    region[rng.random(n_rows) < 0.05] = None
    return pd.DataFrame({"customer_id": np.arange(n_rows), "age": age, "score": score, "visits": visits,
                         "active": active, "plan": plan, "region": region, "label": label})


def write_training_files(root: Path, n_rows: int, seed: int) -> SimpleNamespace:
    """``make_frame`` rows as ``train.parquet`` and its inferred schema as ``schema.yaml`` under ``root``."""
    df = make_frame(n_rows, seed=seed)
    df.to_parquet(root / "train.parquet", index=False)
    (root / "schema.yaml").write_text(schema_to_yaml(infer_schema(df, target="label")))
    return SimpleNamespace(data=root / "train.parquet", schema=root / "schema.yaml")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    return write_training_files(tmp_path_factory.mktemp("training-data"), 3000, seed=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, files) -> SimpleNamespace:
    """One uninterrupted 4-epoch run on 2 nodes x 2 processes, logging to MLflow on SQLite."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("kfloop-train", artifact_location=(root / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    result = train_local(files.data, files.schema, model_dir=root / "model", checkpoint_dir=root / "ckpt",
                         config=CONFIG, shape=SHAPE, log_dir=root / "logs", mlflow_run_id=run_id, mlflow_tracking_uri=uri)
    return SimpleNamespace(result=result, client=client, run_id=run_id, root=root)


def test_config_round_trips_through_a_dict():
    cfg = TrainingConfig(model={"params": {"hidden": [16, 8]}}, epochs=3, device="cpu")
    assert TrainingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert TrainingConfig.from_dict({"model": {"params": {"hidden": [16, 8]}}}).model.params == {"hidden": [16, 8]}
    assert JobShape(nnodes=3, nproc_per_node=4).world_size == 12


def test_config_names_the_valid_keys_for_an_unknown_one():
    with pytest.raises(ValueError, match=r"unknown training key\(s\) \['epoch'\]; valid keys are .*'epochs'"):
        TrainingConfig.from_dict({"epoch": 3})


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "epochs=0: use an integer >= 1"),
    ({"checkpoint_keep": 1}, "keep at least 2"),
    ({"val_fraction": 0.0}, r"use a share in \(0, 0.5\]"),
    ({"regression_loss": "l1"}, r"use one of \('mse', 'huber'\)"),
    ({"device": "tpu"}, r"use one of \('auto', 'cpu', 'cuda'\)"),
    ({"model": {"builder": "1build"}}, "give the name of a function"),
    ({"learning_rate": 0}, "positive number"),
    ({"bucket_cap_mb": 0}, r"bucket_cap_mb=0: use a positive size in MiB"),
    ({"bf16_autocast": "yes"}, "bf16_autocast='yes': use true or false"),
])
def test_config_errors_state_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "slurm"}, r"backend='slurm': use one of \('local', 'kubernetes', 'ray'\)"),
    ({"nnodes": 0}, "nnodes=0: use an integer >= 1"),
    ({"max_restarts": -1}, "max_restarts=-1: use an integer >= 0"),
])
def test_job_shape_errors_state_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JobShape(**kwargs)


def test_every_rank_of_an_attempt_joins_the_same_one_whatever_its_nodes_restart_counts():
    store = dist.HashStore()  # the agent's store lives on across worker restarts and recreated pods
    assert [_join_attempt(store, rank, 2) for rank in (0, 1)] == [0, 0]
    # the worker pod is recreated (its torchrun counts from 0) before the master's torchrun restarts rank 0
    assert [_join_attempt(store, rank, 2) for rank in (1, 0)] == [1, 1]
    # an elastic scale-up: the new rank 2 arrives first, the others restart without counting it
    assert [_join_attempt(store, rank, 3) for rank in (2, 0, 1)] == [2, 2, 2]
    # rank 1 restarts twice before the others restart once: all of them meet in attempt 4
    assert [_join_attempt(store, rank, 3) for rank in (1, 1, 0, 2)] == [3, 4, 4, 4]


def test_trained_model_beats_the_majority_class_on_new_data(reference):
    predictor = Predictor.load(reference.result.model_dir)
    holdout = make_frame(2000, seed=7)
    accuracy = float(np.mean(predictor.predict(holdout) == holdout["label"].to_numpy()))
    majority = float(holdout["label"].value_counts(normalize=True).max())
    assert predictor.classes == ["leave", "stay"]
    assert accuracy > majority + 0.05, (accuracy, majority)
    assert reference.result.world_size == 4
    assert 0.5 < reference.result.metrics["val_accuracy"] <= 1.0


def test_every_rank_ends_with_the_saved_parameters(reference):
    description = json.loads((reference.result.model_dir / MODEL_FILE).read_text())
    digests = description["param_digests"]
    assert len(digests) == 4 and len(set(digests)) == 1
    assert digests[0] == param_digest(Predictor.load(reference.result.model_dir).model)
    assert description["world_size"] == 4
    assert description["config"] == CONFIG.to_dict()
    assert description["metrics"] == reference.result.metrics


def test_rank_zero_alone_logs_one_value_per_epoch_to_mlflow(reference):
    client, run_id = reference.client, reference.run_id
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4], key
    last = {m.step: m.value for m in client.get_metric_history(run_id, "val_accuracy")}[4]
    assert last == pytest.approx(reference.result.metrics["val_accuracy"])
    params = client.get_run(run_id).data.params
    assert (params["world_size"], params["epochs"]) == ("4", "4")
    assert params["model"] == str(CONFIG.to_dict()["model"])


def test_a_longer_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path, files, reference):
    ckpt = tmp_path / "ckpt"
    train_local(files.data, files.schema, model_dir=tmp_path / "model-2", checkpoint_dir=ckpt,
                config=replace(CONFIG, epochs=2), shape=SHAPE, log_dir=tmp_path / "logs-2")
    assert checkpoints.committed_steps(ckpt) == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    sidecar = checkpoints.read_sidecar(ckpt, 2 * STEPS_PER_EPOCH)
    assert (sidecar["state"]["epoch"], sidecar["state"]["step"], sidecar["state"]["sampler_epoch"]) == (2, 20, 1)
    assert len(sidecar["state"]["rng"]) == 4, "one RNG state per rank"

    resumed = train_local(files.data, files.schema, model_dir=tmp_path / "model-4", checkpoint_dir=ckpt,
                          config=CONFIG, shape=SHAPE, log_dir=tmp_path / "logs-4")
    log = (tmp_path / "logs-4" / "node-0.log").read_text()
    assert f"resuming from checkpoint step {2 * STEPS_PER_EPOCH} (epoch 2)" in log
    assert "epoch 1/4" not in log and "epoch 3/4" in log
    assert checkpoints.committed_steps(ckpt) == [3 * STEPS_PER_EPOCH, 4 * STEPS_PER_EPOCH]

    ours = load_file(resumed.model_dir / WEIGHTS_FILE)
    theirs = load_file(reference.result.model_dir / WEIGHTS_FILE)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert resumed.metrics == reference.result.metrics
    assert not torch.equal(load_file(tmp_path / "model-2" / WEIGHTS_FILE)["net.0.weight"], ours["net.0.weight"])


def test_plain_python_trains_one_process_and_refuses_another_runs_checkpoints(tmp_path, files):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}

    def run(cfg: TrainingConfig) -> subprocess.CompletedProcess:
        config = tmp_path / "config.json"
        config.write_text(json.dumps(cfg.to_dict()))
        cmd = [sys.executable, "-m", "training.train", "--data", str(files.data), "--schema", str(files.schema),
               "--model-dir", str(tmp_path / "model"), "--checkpoint-dir", str(tmp_path / "ckpt"),
               "--config", str(config)]
        return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)

    single = replace(CONFIG, epochs=1)
    done = run(single)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "model" / MODEL_FILE).read_text())["world_size"] == 1
    assert checkpoints.committed_steps(tmp_path / "ckpt") == [40]  # 2550 rows / 64 per step

    refused = run(replace(single, epochs=2, seed=7))
    assert refused.returncode != 0
    assert "is from a different training run (differs in ['seed'])" in refused.stderr
