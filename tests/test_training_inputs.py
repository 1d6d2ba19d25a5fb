"""Training input that streams (issue 17, item 4): each rank reads only its shard; the streamed pass fits the same
preprocessing as the whole file; an epoch's batches hold the same training rows as the whole-file path."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist

from data.generate import write_demo
from data.tables import ReadLimits
from data.validation import infer_schema, load_schema, schema_roles
from training.config import TrainingConfig
from training.features import FeatureFit, FeatureTransform, encode_target
from training.inputs import RankInput, ShardedTable, fit_on_rank0
from training.model_code import ModelCode
from training.model_files import MODEL_FILE
from test_training import make_frame

REPO = Path(__file__).resolve().parents[1]
DEMO_SCHEMA = REPO / "data" / "schema.yaml"
ROWS = 3000
VAL_FRACTION, SEED = 0.15, 42
FIT_TOLERANCE = 1e-9
"""Largest relative difference of a fitted mean or standard deviation from the whole-file pandas value (the median
is exact below ``MEDIAN_SAMPLE`` values)."""


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_frame(ROWS, seed=0)


@pytest.fixture(scope="module")
def roles(frame):
    return schema_roles(infer_schema(frame, target="label"))


@pytest.fixture(scope="module")
def path(tmp_path_factory, frame):
    out = tmp_path_factory.mktemp("inputs") / "train.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out, row_group_size=256)  # 12 row groups
    return out


@pytest.fixture(scope="module")
def world():
    """A process group of one (gloo), as ``python -m training.train`` makes without torchrun."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _table(path, chunk_rows: int = 100) -> ShardedTable:
    return ShardedTable(path, val_fraction=VAL_FRACTION, seed=SEED, source=str(path),
                        limits=ReadLimits(chunk_rows=chunk_rows))


def _whole_file_split(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The split training.train made on the whole frame before streaming: the seed's permutation, validation
    first."""
    n_val = round(len(frame) * VAL_FRACTION)
    order = np.random.default_rng(SEED).permutation(len(frame))
    return frame.iloc[np.sort(order[n_val:])], frame.iloc[np.sort(order[:n_val])]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_each_rank_reads_only_its_shard(path, world_size):
    tables = [_table(path) for _ in range(world_size)]
    rows_read = []
    for rank, table in enumerate(tables):
        start, stop = table.shard(rank, world_size)
        rows = np.concatenate([chunk.index.to_numpy() for chunk in table.chunks(start, stop, ["customer_id"])])
        rows_read.append(rows)
        assert rows.min() == start and rows.max() == stop - 1
        groups = set(table.row_groups_read)
        assert groups == {start // 256 + i for i in range(math.ceil(stop / 256) - start // 256)}, "only overlapping"
    everything = np.concatenate(rows_read)
    assert len(everything) == ROWS and set(everything) == set(range(ROWS)), "disjoint and complete"
    assert sum(len(set(t.row_groups_read)) for t in tables) <= 12 + world_size - 1


def test_the_validation_split_is_the_whole_file_split(path, frame):
    table = _table(path)
    train, val = _whole_file_split(frame)
    assert np.flatnonzero(table.is_val).tolist() == val.index.tolist()
    assert table.train_rows == len(train)


def test_streamed_fit_matches_the_whole_file_fit(path, frame, roles, world):
    fitted = fit_on_rank0(_table(path, chunk_rows=77), roles, torch.device("cpu"))
    train, _ = _whole_file_split(frame)
    for col in roles.numeric:
        values = pd.to_numeric(train[col]).astype("float64")
        median = float(values.median())
        filled = values.fillna(median)
        stats = fitted.transform.numeric[col]
        assert stats.median == median
        assert stats.mean == pytest.approx(float(filled.mean()), rel=FIT_TOLERANCE, abs=FIT_TOLERANCE)
        assert stats.std == pytest.approx(float(filled.std(ddof=0)), rel=FIT_TOLERANCE)
    assert fitted.transform.categorical == {c: sorted(train[c].dropna().astype(str).unique()) for c in
                                            roles.categorical}
    assert fitted.classes == ["leave", "stay"]
    assert fitted.class_counts == [int((train["label"] == c).sum()) for c in fitted.classes]


def test_feature_fit_does_not_depend_on_the_chunking(frame, roles, monkeypatch):
    monkeypatch.setattr("training.features.MEDIAN_SAMPLE", 500)  # force the sampled median
    whole = FeatureFit(numeric=roles.numeric, categorical=roles.categorical).update(frame).result()
    chunked = FeatureFit(numeric=roles.numeric, categorical=roles.categorical)
    for start in range(0, ROWS, 130):
        chunked.update(frame.iloc[start:start + 130])
    chunked = chunked.result()
    for col in roles.numeric:
        assert chunked.numeric[col].median == whole.numeric[col].median, "the same sampled rows"
        assert chunked.numeric[col].mean == pytest.approx(whole.numeric[col].mean, rel=FIT_TOLERANCE)
        assert chunked.numeric[col].std == pytest.approx(whole.numeric[col].std, rel=FIT_TOLERANCE)
    assert chunked.categorical == whole.categorical
    score = pd.to_numeric(frame["score"]).dropna()
    assert abs(whole.numeric["score"].median - score.median()) < 0.15 * score.std(), "a sample of 500 of 2850"


@pytest.mark.parametrize("chunk_rows", [37, 10_000])
def test_an_epoch_holds_the_whole_file_training_rows(path, frame, roles, world, chunk_rows):
    table = _table(path, chunk_rows=chunk_rows)
    fitted = fit_on_rank0(table, roles, torch.device("cpu"))
    data = RankInput(table, fitted, "label", rank=0, world_size=1, seed=SEED, batch_size=64,
                     device=torch.device("cpu"))
    batches = list(data.batches(epoch=3))
    assert len(batches) == data.steps_per_epoch == math.ceil(table.train_rows / 64)
    assert all(len(y) == 64 for _, y in batches[:-1])
    x = torch.cat([b[0] for b in batches]).numpy()
    y = torch.cat([b[1] for b in batches]).numpy()
    train, val = _whole_file_split(frame)
    expected_x = FeatureTransform.fit(train, numeric=roles.numeric, categorical=roles.categorical).transform(train)
    expected_y = encode_target(train["label"], fitted.classes)
    order, expected = np.lexsort(np.c_[x, y].T), np.lexsort(np.c_[expected_x, expected_y].T)
    np.testing.assert_allclose(x[order], expected_x[expected], rtol=1e-6, atol=1e-6)
    assert (y[order] == expected_y[expected]).all()
    assert not np.array_equal(y, expected_y), "shuffled"
    again = torch.cat([b[1] for b in data.batches(epoch=3)]).numpy()
    assert np.array_equal(again, y), "an epoch's order is a function of (seed, epoch, rank): resume repeats it"
    val_rows = sum(len(vy) for _, vy in data.validation())
    assert val_rows == len(val)


def test_a_csv_file_gives_the_rows_and_columns_of_the_parquet_file(path, frame, tmp_path):
    csv = tmp_path / "train.csv"
    frame.to_csv(csv, index=False)
    columns = ["plan", "score", "label"]
    for start, stop in [(0, ROWS), (100, 1234)]:
        from_csv = pd.concat(_table(csv, chunk_rows=37).chunks(start, stop, columns))
        from_parquet = pd.concat(_table(path, chunk_rows=37).chunks(start, stop, columns))
        assert list(from_csv.columns) == columns and from_csv.index.tolist() == list(range(start, stop))
        pd.testing.assert_frame_equal(from_csv, from_parquet)


def test_uneven_shards_take_the_same_number_of_steps(path, frame, roles, world):
    table = _table(path)
    fitted = fit_on_rank0(table, roles, torch.device("cpu"))
    counts = []
    for rank in range(3):
        data = RankInput(table, fitted, "label", rank=rank, world_size=3, seed=SEED, batch_size=64,
                         device=torch.device("cpu"))
        counts.append([len(y) for _, y in data.batches(epoch=0)])
    assert counts[0] == counts[1] == counts[2]
    assert sum(counts[0]) == math.ceil(table.train_rows / 3)


RESULT_TOLERANCE = 0.02
"""Largest difference in validation accuracy and loss between streamed training and the whole-file path on the
demo data (measured before the change, 2 ranks, default config: 0.0011 and 0.0012)."""


def _whole_file_training(frame: pd.DataFrame, roles, cfg: TrainingConfig) -> dict[str, float]:
    """The pre-streaming path in one process: whole frame in memory, one global shuffle per epoch."""
    n_val = round(len(frame) * cfg.val_fraction)
    order = np.random.default_rng(cfg.seed).permutation(len(frame))
    train, val = frame.iloc[np.sort(order[n_val:])], frame.iloc[np.sort(order[:n_val])]
    transform = FeatureTransform.fit(train, numeric=roles.numeric, categorical=roles.categorical)
    classes = sorted(frame[roles.target].unique().tolist())
    x, y = torch.from_numpy(transform.transform(train)), torch.from_numpy(encode_target(train[roles.target], classes))
    torch.manual_seed(cfg.seed)
    model = ModelCode.load(cfg.model).build(transform.n_outputs, len(classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.lr_gamma)
    for epoch in range(cfg.epochs):
        model.train()
        for batch in torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch)).split(cfg.batch_size):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(transform.transform(val)))
        labels = torch.from_numpy(encode_target(val[roles.target], classes))
        return {"val_loss": float(torch.nn.functional.cross_entropy(logits, labels)),
                "val_accuracy": float((logits.argmax(dim=1) == labels).double().mean())}


def test_streamed_training_matches_the_whole_file_path_within_tolerance(tmp_path):
    files = write_demo(tmp_path / "demo")
    schema = load_schema(DEMO_SCHEMA)
    cfg = TrainingConfig()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "training.train", "--data", str(files["train.parquet"]),
                           "--schema", str(DEMO_SCHEMA), "--model-dir", str(tmp_path / "model"),
                           "--checkpoint-dir", str(tmp_path / "ckpt"), "--config", str(tmp_path / "config.json")],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    streamed = json.loads((tmp_path / "model" / MODEL_FILE).read_text())["metrics"]
    whole = _whole_file_training(pd.read_parquet(files["train.parquet"]), schema_roles(schema), cfg)
    assert streamed["val_accuracy"] == pytest.approx(whole["val_accuracy"], abs=RESULT_TOLERANCE)
    assert streamed["val_loss"] == pytest.approx(whole["val_loss"], abs=RESULT_TOLERANCE)
