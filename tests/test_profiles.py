"""Reference profiles: sketches built in one streaming pass, stored as JSON with the version, and a drift check
against one (current batch in chunks) gives the full reference's verdicts (exactly where both sides are kept
exactly, within the stated error from sketches); reports without Evidently's full preset."""
from __future__ import annotations

import json
import mlflow
import numpy as np
import pandas as pd
import pytest

from data.profiles import PROFILE_ARTIFACT, ReferenceProfile, build_profile
from data.sketches import SketchSettings
from data.tables import ReadLimits, read_table, table_chunks
from data.validation import infer_schema, schema_to_yaml
from monitoring.drift import check_drift, check_drift_profile, same_verdict
from monitoring.drift_policy import DriftPolicy
from monitoring.steps.checks import drift_step
from test_registry_versions import TARGET, build_model, make_frame
from data.fileio import file_digest
from training.config import JobShape, TrainingConfig
from training.gate import PromotionPolicy, evaluate
from training.model import Predictor
from training.model_files import JOB_SHAPE_FILE, MODEL_FILE
from training.registry.versions import champion_profile
from training.steps.register import register_step

NUMERIC, CATEGORICAL = ["x", "items", "flag"], ["color"]
KINDS = {"x": "numeric", "items": "numeric", "flag": "numeric", "color": "categorical"}


def batch(n: int, seed: int, *, x_shift: float = 0.0, colors=(0.5, 0.3, 0.2)) -> pd.DataFrame:
    """``x`` float with nulls and infinities, ``items`` small ints, ``flag`` bool, ``color`` text with nulls."""
    rng = np.random.default_rng(seed)
    x = rng.normal(10 + x_shift, 2, n)
    x[rng.random(n) < 0.05] = np.nan
    x[rng.random(n) < 0.002] = np.inf
    color = rng.choice(["red", "green", "blue"], n, p=colors).astype(object)
    color[rng.random(n) < 0.05] = None
    return pd.DataFrame({"x": x, "items": rng.poisson(3, n), "flag": rng.random(n) < 0.3, "color": color})


def predict_class(frame: pd.DataFrame) -> np.ndarray:
    return np.where(frame["x"].fillna(0) + frame["items"] > 13, "yes", "no").astype(object)


def predict_number(frame: pd.DataFrame) -> np.ndarray:
    return frame["x"].fillna(0).to_numpy() * 0.5 + frame["items"].to_numpy()


def without_kll(profile: dict) -> dict:
    return {**profile, "columns": {n: {k: v for k, v in c.items() if k != "kll"} for n, c in profile["columns"].items()}}


def chunks(frame: pd.DataFrame, rows: int):
    return (frame.iloc[start:start + rows].reset_index(drop=True) for start in range(0, len(frame), rows))


def test_profile_round_trips_through_json(tmp_path):
    profile = build_profile(chunks(batch(5000, 1), 999), KINDS, predict=predict_class,
                            settings=SketchSettings(exact_values=1000, sample_size=1500, seed=3), source="mem")
    assert not profile.columns["x"].exact and len(profile.columns["x"].sample) == 1500
    assert profile.columns["x"].kll.n == profile.columns["x"].count
    assert profile.columns["items"].exact and profile.columns["color"].exact
    assert sum(profile.columns["color"].counts) + profile.columns["color"].nulls == profile.rows == 5000
    assert profile.columns["prediction"].values.tolist() == ["no", "yes"]

    path = profile.write(tmp_path / "profile.json")
    assert ReferenceProfile.read(path).to_dict() == profile.to_dict()
    assert "pickle" not in path.read_text() and json.loads(path.read_text())["columns"]["x"]["kll"]
    data = json.loads(path.read_text())
    data["format"] = 99
    with pytest.raises(ValueError, match="format 99 is not 2: rebuild the profile"):
        ReferenceProfile.from_dict(data)


def test_sampled_column_keeps_exact_moments():
    frame = batch(20_000, 2)
    profile = build_profile(chunks(frame, 4096), KINDS, settings=SketchSettings(exact_values=1000, sample_size=2000))
    x = frame["x"].to_numpy()
    x = x[np.isfinite(x)]
    column = profile.columns["x"]
    assert column.missing == 20_000 - len(x) and column.nonfinite == np.isinf(frame["x"]).sum()
    assert (column.min, column.max) == (x.min(), x.max())
    assert column.mean == pytest.approx(np.mean(x), rel=1e-12) and column.std == pytest.approx(np.std(x), rel=1e-9)


@pytest.mark.parametrize(("rows", "policy"), [
    (600, DriftPolicy()),  # Evidently's choice for small references: ks, chisquare, z
    (3000, DriftPolicy()),  # large: wasserstein, jensenshannon
    (3000, DriftPolicy(method="psi")),
    (3000, DriftPolicy(column_overrides={"x": {"method": "ks"}, "color": {"method": "chisquare"},
                                         "prediction": {"method": "kl_div"}})),
])
@pytest.mark.parametrize("predict", [predict_class, predict_number])
def test_check_against_profile_equals_check_against_full_reference(rows, policy, predict):
    reference, current = batch(rows, 1), batch(rows // 2, 2, x_shift=0.3, colors=(0.4, 0.3, 0.3))
    current.loc[:40, "items"] = None
    kind = "categorical" if predict is predict_class else "numeric"
    profile = build_profile(chunks(reference, 257), KINDS, predict=predict, prediction_kind=kind)
    full = check_drift(reference.assign(prediction=predict(reference)), current.assign(prediction=predict(current)),
                       numeric=NUMERIC, categorical=CATEGORICAL, policy=policy, prediction_kind=kind)

    streamed = check_drift_profile(profile, chunks(current, 101), numeric=NUMERIC, categorical=CATEGORICAL,
                                   policy=policy, predict=predict)

    assert list(streamed.columns) == [*NUMERIC, *CATEGORICAL, "prediction"]
    for name, verdict in full.columns.items():
        assert same_verdict(streamed.columns[name], verdict), (name, streamed.columns[name], verdict)
    assert (streamed.drifted, streamed.share_drifted_columns) == (full.drifted, full.share_drifted_columns)


def test_sampled_numeric_column_is_within_the_documented_tolerance():
    reference = batch(40_000, 1)
    settings = SketchSettings(exact_values=1000, sample_size=5000)
    profile = build_profile(chunks(reference, 8192), KINDS, settings=settings)
    for shift, drifted in ((0.0, False), (1.0, True)):
        current = batch(20_000, 2, x_shift=shift)
        full = check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=DriftPolicy())
        streamed = check_drift_profile(profile, chunks(current, 4096), numeric=NUMERIC, categorical=CATEGORICAL,
                                       policy=DriftPolicy())
        ours, theirs = streamed.columns["x"], full.columns["x"]
        assert (ours.method, ours.basis, ours.drifted, theirs.drifted) == ("wasserstein", "sketch", drifted, drifted)
        assert abs(ours.score - theirs.score) <= ours.error < 0.1
        for name in ("items", "flag", "color"):
            assert same_verdict(streamed.columns[name], full.columns[name])


def test_all_null_columns_against_a_profile():
    reference, current = batch(1200, 1), batch(1200, 2)
    reference["color"] = None
    current["x"] = np.nan
    profile = build_profile(chunks(reference, 500), KINDS)
    full = check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=DriftPolicy())
    streamed = check_drift_profile(profile, chunks(current, 500), numeric=NUMERIC, categorical=CATEGORICAL,
                                   policy=DriftPolicy())
    assert {name: col.method for name, col in streamed.columns.items()}["x"] == "all_null"
    for name, verdict in full.columns.items():
        assert same_verdict(streamed.columns[name], verdict)


def test_default_report_is_a_summary_without_evidently(tmp_path):
    reference, current = batch(3000, 1), batch(3000, 2, colors=(0.2, 0.3, 0.5))
    path = tmp_path / "drift.html"
    result = check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=DriftPolicy(),
                         report_path=path)
    page = path.read_text(encoding="utf-8")
    assert "Value Drift for column" not in page and len(page) < 20_000  # Evidently's page holds its JS bundle
    assert "Built from the verdicts and both sides' summaries" in page
    assert "<td>color</td><td>categorical</td><td>jensenshannon</td>" in page and "DRIFT" in page
    assert result.columns["color"].drifted


def test_sampled_evidently_report_says_so(tmp_path):
    reference, current = batch(3000, 1), batch(3000, 2)
    profile = build_profile(chunks(reference, 1000), KINDS)
    path = tmp_path / "drift.html"
    policy = DriftPolicy(report="evidently_sample", report_sample_rows=500)
    check_drift_profile(profile, chunks(current, 1000), numeric=NUMERIC, categorical=CATEGORICAL, policy=policy,
                        report_path=path)
    page = path.read_text(encoding="utf-8")
    assert "Evidently report on a seeded sample</b> of 500 reference and 500 current rows" in page
    assert "Value Drift for column color" in page
    with pytest.raises(ValueError, match="report=evidently_full needs the reference table"):
        check_drift_profile(profile, chunks(current, 1000), numeric=NUMERIC, categorical=CATEGORICAL,
                            policy=DriftPolicy(report="evidently_full"), report_path=path)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_profile_of_a_file_in_chunks_equals_the_profile_of_the_frame(tmp_path, suffix):
    frame = batch(3000, 4)
    frame["x"] = frame["x"].replace(np.inf, np.nan)
    path = tmp_path / f"data{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False, row_group_size=700)
    with table_chunks(path, text_columns=CATEGORICAL, limits=ReadLimits(chunk_rows=700)) as (parts, source):
        read = list(parts)
    profile = build_profile(read, KINDS)
    sizes = [len(part) for part in read]
    assert sizes == [700, 700, 700, 700, 200] and source.md5 == file_digest(path, "md5")
    again = build_profile(read, KINDS)  # the same chunks: the same sketches but KLL's (its compaction is random)
    assert without_kll(again.to_dict()) == without_kll(profile.to_dict())
    whole = build_profile([read_table(path)], KINDS)  # as the whole-file reader reads it, in one chunk
    for name, column in whole.columns.items():
        ours = profile.columns[name]
        assert (ours.rows, ours.missing, ours.values.tolist(), ours.counts.tolist()) == (
            column.rows, column.missing, column.values.tolist(), column.counts.tolist()), name
        if column.kind == "numeric":
            assert (ours.mean, ours.std) == (pytest.approx(column.mean, rel=1e-12), pytest.approx(column.std, rel=1e-9))


def test_registration_stores_the_profile_and_drift_reads_no_reference_file(tmp_path, isolated_env):
    data, holdout = make_frame(1500, 1), make_frame(400, 2)
    train = tmp_path / "train.csv"
    data.to_csv(train, index=False)
    schema = tmp_path / "schema.yaml"
    schema.write_text(schema_to_yaml(infer_schema(data, target=TARGET)))
    model_dir = build_model(tmp_path / "model", data, steps=60)
    description = json.loads((model_dir / MODEL_FILE).read_text())  # what train.py records with the model
    (model_dir / MODEL_FILE).write_text(json.dumps({**description, "config": TrainingConfig(seed=7).to_dict()}))
    (model_dir / JOB_SHAPE_FILE).write_text(json.dumps(JobShape(nproc_per_node=1).to_dict()))  # as the train step
    predictor = Predictor.load(model_dir)
    decision = evaluate(y_true=holdout[TARGET], challenger_proba=predictor.predict_proba(holdout),
                        champion_proba=None, classes=predictor.classes, holdout=holdout,
                        policy=PromotionPolicy(floor=0.3, bootstrap_samples=100))
    report = tmp_path / "evaluation.json"
    report.write_text(json.dumps(decision.to_dict()))
    client = mlflow.MlflowClient()
    experiment = client.create_experiment("profiles", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    version = register_step(model_dir=str(model_dir), report_path=str(report), schema_path=str(schema),
                            run_id=run_id, model_name="profiled", dataset_uri=str(train),
                            data_md5=file_digest(train, "md5"), holdout_sha256="0" * 64, pipeline_run_id="p1",
                            champion_version="", holdout_fraction=0.2, split_seed=0)
    assert PROFILE_ARTIFACT in {a.path for a in client.list_artifacts(run_id)}
    client.set_registered_model_alias("profiled", "champion", version)
    profile = champion_profile("profiled")
    assert profile.rows == 1500 and set(profile.columns) == {"age", "income", "region", "prediction"}

    current = tmp_path / "current.parquet"
    make_frame(900, 3).assign(income=lambda f: f["income"] + 8).to_parquet(current, index=False)
    full = drift_step(current_uri=str(current), reference_uri=str(train), schema_uri=str(schema),
                      model_name="profiled", policy={}, report_out="")
    train.unlink()  # the check against the stored profile must not need the training data
    streamed = drift_step(current_uri=str(current), reference_uri="", schema_uri="", model_name="profiled",
                          policy={}, report_out=str(tmp_path / "drift.html"))

    assert streamed.reference_profile and not full.reference_profile
    assert streamed.reference_uri == full.reference_uri == str(train)
    assert list(streamed.drift.columns) == list(full.drift.columns) == ["age", "income", "region", "prediction"]
    for name, verdict in full.drift.columns.items():
        assert same_verdict(streamed.drift.columns[name], verdict), name
    assert streamed.drift.columns["income"].drifted
    assert "reference profile" in (tmp_path / "drift.html").read_text(encoding="utf-8")
