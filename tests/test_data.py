"""The demo data generator, its CLI and its DVC stage."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.compose import make_column_transformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from data.fileio import file_digest
from data.generate import CONTRACTS, PLANS, generate, write_demo

REPO = Path(__file__).resolve().parents[1]
NUMERIC = ["age", "tenure_months", "monthly_charges", "total_charges", "support_calls"]
CATEGORICAL = ["contract", "payment_method", "region", "plan"]
DEMO_FILES = ("train.parquet", "batch_stable.parquet", "batch_drifted.parquet")


def test_generate_columns_types_and_rates():
    df = generate(6000, seed=0)
    assert list(df.columns) == ["customer_id", *NUMERIC, *CATEGORICAL, "churned"]
    assert df["customer_id"].is_unique
    for name in ("customer_id", "age", "tenure_months", "support_calls", "churned"):
        assert df[name].dtype == np.int64, name
    assert df["monthly_charges"].dtype == np.float64
    assert set(df["contract"]) == set(CONTRACTS)
    assert set(df["churned"]) == {0, 1}
    assert 0.25 <= df["churned"].mean() <= 0.35
    assert 0.03 <= df["total_charges"].isna().mean() <= 0.07
    assert 0.015 <= df["region"].isna().mean() <= 0.045
    nullable = {name for name in df.columns if df[name].isna().any()}
    assert nullable == {"total_charges", "region"}


def test_generate_is_deterministic_per_seed():
    pd.testing.assert_frame_equal(generate(500, seed=7), generate(500, seed=7))
    assert not generate(500, seed=7).equals(generate(500, seed=8))


def test_write_demo_same_bytes_for_same_seed(tmp_path):
    first = write_demo(tmp_path / "a", seed=3, rows=600)
    second = write_demo(tmp_path / "b", seed=3, rows=600)
    other = write_demo(tmp_path / "c", seed=4, rows=600)
    assert list(first) == list(DEMO_FILES)
    for name in DEMO_FILES:
        assert first[name].read_bytes() == second[name].read_bytes(), name
        assert first[name].read_bytes() != other[name].read_bytes(), name
    frames = {name: pd.read_parquet(path) for name, path in first.items()}
    assert [len(frames[name]) for name in DEMO_FILES] == [600, 200, 400]
    ids = pd.concat([frames[name]["customer_id"] for name in DEMO_FILES])
    assert ids.is_unique


def test_cli_writes_three_files(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "data.generate", "--out", str(out), "--rows", "300", "--seed", "5"],
                            cwd=REPO, capture_output=True, text=True, check=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(DEMO_FILES)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"wrote {out / name}" for name in DEMO_FILES]
    assert (out / "train.parquet").read_bytes() == write_demo(tmp_path / "api", seed=5, rows=300)[
        "train.parquet"].read_bytes()


def test_cli_rejects_too_few_rows(tmp_path):
    result = subprocess.run([sys.executable, "-m", "data.generate", "--out", str(tmp_path), "--rows", "2"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert "rows must be >= 3" in result.stderr


@pytest.mark.parametrize("kwargs", [{"covariate_shift": -0.1}, {"concept_shift": 3.0}])
def test_generate_rejects_bad_shift(kwargs):
    with pytest.raises(ValueError, match="must be within"):
        generate(10, seed=0, **kwargs)


def test_covariate_shift_moves_distributions():
    base = generate(20000, seed=1)
    shifted = generate(20000, seed=1, covariate_shift=1.0)
    for name, min_change in (("age", 5.0), ("monthly_charges", 8.0), ("support_calls", 0.3)):
        assert shifted[name].mean() - base[name].mean() > min_change, name
    assert shifted["tenure_months"].mean() < base["tenure_months"].mean() - 2.0
    share = lambda df, col, value: (df[col] == value).mean()  # noqa: E731
    assert share(shifted, "contract", "month-to-month") - share(base, "contract", "month-to-month") > 0.05
    assert share(shifted, "plan", PLANS[2]) - share(base, "plan", PLANS[2]) > 0.1
    assert share(shifted, "region", "west") - share(base, "region", "west") > 0.1
    # Same categories and null rates: the data stays valid, only its mix moves.
    for name in CATEGORICAL:
        assert set(shifted[name].dropna()) == set(base[name].dropna()), name


def _model():
    features = make_column_transformer(
        (make_pipeline(SimpleImputer(), StandardScaler()), NUMERIC),
        (OneHotEncoder(handle_unknown="ignore"), CATEGORICAL),
    )
    return make_pipeline(features, LogisticRegression(max_iter=1000))


def _accuracy(model, df: pd.DataFrame) -> float:
    return float((model.predict(df) == df["churned"]).mean())


def _fit(df: pd.DataFrame):
    return _model().fit(df.fillna({"region": "unknown"}), df["churned"])


def test_concept_shift_degrades_an_unshifted_model():
    champion = _fit(generate(4000, seed=0))
    stable = generate(3000, seed=1).fillna({"region": "unknown"})
    shifted_train = generate(3000, seed=2, concept_shift=1.0)
    shifted_test = generate(3000, seed=3, concept_shift=1.0).fillna({"region": "unknown"})
    retrained = _fit(shifted_train)

    assert 0.75 <= _accuracy(champion, stable) <= 0.85
    assert 0.25 <= shifted_test["churned"].mean() <= 0.35
    assert _accuracy(retrained, shifted_test) - _accuracy(champion, shifted_test) >= 0.05


def test_dvc_stage_reproduces_the_demo_files(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    for name in ("__init__.py", "generate.py", "dvc.yaml"):
        shutil.copy(REPO / "data" / name, repo / "data" / name)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm"], cwd=repo, env=env, check=True, capture_output=True)
    subprocess.run([*dvc, "repro", "data/dvc.yaml"], cwd=repo, env=env, check=True, capture_output=True)

    lock = yaml.safe_load((repo / "data" / "dvc.lock").read_text())
    outs = {Path(out["path"]).name: out["md5"] for out in lock["stages"]["generate"]["outs"]}
    assert sorted(outs) == sorted(DEMO_FILES)
    expected = write_demo(tmp_path / "expected")
    for name in DEMO_FILES:
        produced = repo / "data" / "demo" / name
        assert outs[name] == file_digest(produced, "md5"), name
        assert produced.read_bytes() == expected[name].read_bytes(), name
