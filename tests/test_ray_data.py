"""``drift.engine: ray``: Ray Data reads the tables in blocks on a real local Ray cluster (a head with 2 worker
CPUs, token authentication, shared by this module), each block sketched by the single-process path's per-chunk code
and merged on the driver; verdicts, scores and schema violations equal the local engine's."""
from __future__ import annotations

import json

import pytest

import torch

from data.engine import DataEngine
from data.errors import EXIT_FINDING
from data.generate import write_demo
from data.profiles import build_profile, profile_table
from data.ray_blocks import map_chunks, profile_dataset, profile_table_on_ray, read_dataset, validate_on_ray
from data.ray_cluster import ray_session
from data.sketches import SketchSettings
from data.tables import ReadLimits, iter_table, read_table
from data.validation import load_schema, schema_roles, validate
from monitoring.drift import check_drift_profile, same_verdict
from monitoring.drift_policy import DriftPolicy
from monitoring.ray_drift import RayTable
from monitoring.steps.checks import drift_step
from pipelines.cli import main
from training.config import ModelSpec
from training.features import FeatureTransform, target_classes
from training.model import Predictor, save_model_dir
from training.model_code import ModelCode
from training.steps.register import reference_profile

SCHEMA = "data/schema.yaml"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """3000 training rows, 1000 stable and 2000 drifted ones: every column small enough to be kept exactly, so
    both engines' verdicts are the full data's."""
    files = write_demo(tmp_path_factory.mktemp("ray-demo"), rows=3000)
    drifted = files["batch_drifted.parquet"]
    files["batch_drifted.csv"] = drifted.with_suffix(".csv")
    read_table(drifted).to_csv(files["batch_drifted.csv"], index=False)
    return files


def _check(demo, current: str, **policy):
    return drift_step(current_uri=str(demo[current]), reference_uri=str(demo["train.parquet"]), schema_uri=SCHEMA,
                      model_name="", policy=policy, report_out="")


@pytest.mark.parametrize("current", ["batch_stable.parquet", "batch_drifted.parquet", "batch_drifted.csv"])
def test_the_ray_engine_gives_the_local_engines_verdicts(demo, ray_head, current):
    local = _check(demo, current)
    on_ray = _check(demo, current, engine="ray", ray_address=ray_head)
    assert on_ray.drift.drifted == local.drift.drifted
    assert on_ray.drift.share_drifted_columns == local.drift.share_drifted_columns
    assert list(on_ray.drift.columns) == list(local.drift.columns)
    for name, verdict in local.drift.columns.items():
        assert same_verdict(on_ray.drift.columns[name], verdict), (name, on_ray.drift.columns[name], verdict)
    assert on_ray.drift.schema_violations.keys() == local.drift.schema_violations.keys()
    for name, shares in local.drift.schema_violations.items():
        assert on_ray.drift.schema_violations[name] == pytest.approx(shares, abs=1e-12), name
    assert on_ray.data_md5 == local.data_md5
    if current.startswith("batch_drifted"):
        assert on_ray.drift.drifted


def test_blocks_are_summarised_apart_and_merged_into_the_single_process_profile(demo, ray_head):
    roles = schema_roles(load_schema(SCHEMA))
    kinds = {c: "numeric" for c in roles.numeric} | {c: "categorical" for c in roles.categorical}
    limits = ReadLimits(chunk_rows=400)
    local = build_profile(iter_table(demo["train.parquet"], text_columns=roles.categorical, categories=True), kinds)
    with ray_session(ray_head):
        dataset = read_dataset(demo["train.parquet"], text_columns=roles.categorical)
        rows = [part["rows"] for part in map_chunks(dataset, lambda chunk, seed: {"rows": len(chunk)},
                                                    limits=limits)]
        on_ray = profile_dataset(dataset, kinds, limits=limits)
    assert sorted(rows) == [200] + [400] * 7  # 3000 rows in chunks of 400, each summarised on its own
    assert on_ray.rows == local.rows == 3000
    for name, column in local.columns.items():
        ray_column = on_ray.columns[name]
        assert (ray_column.rows, ray_column.count, ray_column.missing) == (column.rows, column.count, column.missing)
        assert ray_column.exact and column.exact
        assert list(ray_column.values) == list(column.values) and list(ray_column.counts) == list(column.counts)


def test_the_champion_scores_the_blocks_on_the_workers(demo, ray_head, tmp_path):
    """The champion's predictions: its model code (imported from the model directory's source) travels to the
    workers, each block is scored there, and the ``prediction`` column's verdict is the local engine's."""
    schema = load_schema(SCHEMA)
    roles = schema_roles(schema)
    kinds = {c: "numeric" for c in roles.numeric} | {c: "categorical" for c in roles.categorical}
    frame = read_table(demo["train.parquet"])
    transform = FeatureTransform.fit(frame, numeric=roles.numeric, categorical=roles.categorical)
    classes, code = target_classes(frame[roles.target]), ModelCode.load(ModelSpec(params={"hidden": [8]}))
    torch.manual_seed(0)
    save_model_dir(tmp_path / "model", model=code.build(transform.n_outputs, len(classes)), code=code,
                   n_inputs=transform.n_outputs, n_outputs=len(classes), transform=transform, classes=classes,
                   target=roles.target)
    predict = Predictor.load(tmp_path / "model").predict

    def chunks(name: str):
        return iter_table(demo[name], text_columns=roles.categorical, categories=True)

    profile = build_profile(chunks("train.parquet"), kinds, predict=predict)
    local = check_drift_profile(profile, chunks("batch_drifted.parquet"), numeric=roles.numeric,
                                categorical=roles.categorical, policy=DriftPolicy(), schema=schema, predict=predict)
    with ray_session(ray_head):
        on_ray_profile = RayTable(str(demo["train.parquet"]), text_columns=roles.categorical).profile(
            kinds, predict=predict, prediction_kind="categorical", source="")
        on_ray = RayTable(str(demo["batch_drifted.parquet"]), text_columns=roles.categorical).drift(
            on_ray_profile, numeric=roles.numeric, categorical=roles.categorical, policy=DriftPolicy(engine="ray"),
            report_path=None, schema=schema, predict=predict)
    predicted = on_ray_profile.columns["prediction"]
    assert (list(predicted.values), list(predicted.counts)) == (list(profile.columns["prediction"].values),
                                                                list(profile.columns["prediction"].counts))
    assert "prediction" in on_ray.columns
    for name, verdict in local.columns.items():
        assert same_verdict(on_ray.columns[name], verdict), (name, on_ray.columns[name], verdict)


def test_kfloop_drift_engine_ray_from_the_command_line(demo, ray_head, capsys):
    args = ["drift", "--reference", str(demo["train.parquet"]), "--current", str(demo["batch_drifted.parquet"]),
            "--schema", SCHEMA, "--json"]
    assert main([*args, "--engine", "ray", "--ray-address", ray_head]) == 0
    on_ray = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    local = json.loads(capsys.readouterr().out)
    assert on_ray["drifted"] is local["drifted"] is True
    assert {n: c["drifted"] for n, c in on_ray["columns"].items()} == {n: c["drifted"] for n, c in
                                                                        local["columns"].items()}


def test_the_engine_setting_is_checked():
    with pytest.raises(ValueError, match="engine='spark'"):
        DriftPolicy(engine="spark")
    with pytest.raises(ValueError, match="set engine: ray"):
        DriftPolicy(ray_address="ray://head:10001")


def test_the_drift_pipelines_step_drives_the_ray_cluster(demo, ray_head, isolated_env, capsys):
    """``kfloop run drift --local``: the KFP step (kfp.local, a process of its own) gets ``drift.engine: ray`` in
    its drift policy and checks on the Ray cluster (its log says so), with the local engine's verdict."""
    settings = [f"current_uri={demo['batch_stable.parquet']}", f"reference_uri={demo['train.parquet']}",
                f"schema_uri={SCHEMA}", "model_name=ray-drift", "drift.engine=ray", f"drift.ray_address={ray_head}"]
    code = main(["--workdir", str(isolated_env.workdir), "run", "drift", "--local", "--json",
                 *[arg for setting in settings for arg in ("--set", setting)]])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert f"drift: engine ray, on {ray_head}" in err
    verdict = json.loads(out)
    local = _check(demo, "batch_stable.parquet")
    assert verdict["drifted"] is local.drift.drifted is False  # no retraining run to start
    assert verdict["share_drifted_columns"] == local.drift.share_drifted_columns


def _model_dir(demo, path):
    """A small champion trained on nothing: its predictions are what the profiles sketch, not its quality."""
    roles = schema_roles(load_schema(SCHEMA))
    frame = read_table(demo["train.parquet"])
    transform = FeatureTransform.fit(frame, numeric=roles.numeric, categorical=roles.categorical)
    classes, code = target_classes(frame[roles.target]), ModelCode.load(ModelSpec(params={"hidden": [8]}))
    torch.manual_seed(0)
    save_model_dir(path, model=code.build(transform.n_outputs, len(classes)), code=code,
                   n_inputs=transform.n_outputs, n_outputs=len(classes), transform=transform, classes=classes,
                   target=roles.target)
    return Predictor.load(path).predict


@pytest.mark.parametrize("data", ["train.parquet", "batch_drifted.csv"])
def test_registrations_profile_built_on_ray_is_the_single_process_one(demo, ray_head, tmp_path, data):
    """``drift.engine: ray`` at registration (:func:`training.steps.register.reference_profile`): Ray Data profiles the
    training data with the champion's predictions on the cluster; every column is small enough to be kept exactly,
    so counts, extremes and every value's count are the single process's (moments up to the order of float sums;
    the KLL sketches and the seeded samples differ by merge order and seeds, within their bounds: next test)."""
    schema, predict = load_schema(SCHEMA), _model_dir(demo, tmp_path / "model")
    local = reference_profile(str(demo[data]), schema, predict=predict, engine=DataEngine())
    on_ray = reference_profile(str(demo[data]), schema, predict=predict,
                               engine=DataEngine(engine="ray", ray_address=ray_head))
    assert "prediction" in on_ray.columns
    assert (on_ray.rows, on_ray.source, on_ray.settings) == (local.rows, local.source, local.settings)
    assert list(on_ray.columns) == list(local.columns)
    for name, column in local.columns.items():
        assert column.exact and on_ray.columns[name].exact, name
        ours, theirs = (_exact_part(c) for c in (on_ray.columns[name], column))
        assert ours == theirs | {key: pytest.approx(theirs[key], rel=1e-12) for key in ("mean", "m2") if key in ours}


def _exact_part(column) -> dict:
    """A column sketch's JSON form less its merge-order and seed dependent parts (KLL bytes, seeded sample)."""
    return {key: value for key, value in column.to_dict().items() if key not in ("kll", "sample", "keys")}


def test_a_profile_in_sketches_merged_from_blocks_stays_within_the_sketches_error_bounds(demo, ray_head):
    """Columns past ``exact_values`` rely on their KLL sketches: the blocks' merged sketches hold the exact counts
    and answer every quantile within the sketch's rank error of the single process's."""
    schema, settings = load_schema(SCHEMA), SketchSettings(k=64, exact_values=100, sample_size=100)
    local = profile_table(demo["train.parquet"], schema, settings=settings)
    with ray_session(ray_head):
        on_ray = profile_table_on_ray(demo["train.parquet"], schema, settings=settings,
                                      limits=ReadLimits(chunk_rows=400))
    values = read_table(demo["train.parquet"])
    for name, column in local.columns.items():
        ray_column = on_ray.columns[name]
        assert (ray_column.rows, ray_column.count, ray_column.missing) == (column.rows, column.count, column.missing)
        if ray_column.exact:
            assert list(ray_column.values) == list(column.values) and list(ray_column.counts) == list(column.counts)
            continue
        if ray_column.kind != "numeric":
            continue
        data = values[name].dropna().sort_values().to_numpy()
        for rank in (0.1, 0.25, 0.5, 0.75, 0.9):
            for sketch in (column, ray_column):
                true_rank = (data <= sketch.kll.get_quantile(rank)).mean()
                assert abs(true_rank - rank) <= 2 * settings.rank_error, (name, rank, true_rank)


def _bad_table(demo, tmp_path):
    """The training rows broken across chunks of 400: a key repeated in the first and the last block, an age out of
    range in two blocks, an unknown contract and a missing one; the CSV adds text in a number column."""
    frame = read_table(demo["train.parquet"])
    frame.loc[2950, "customer_id"] = frame.loc[5, "customer_id"]
    frame.loc[[10, 1500], "age"] = [7, 140]
    frame.loc[2200, "contract"], frame.loc[800, "contract"] = "weekly", None
    files = {"parquet": tmp_path / "bad.parquet", "csv": tmp_path / "bad.csv"}
    frame.to_parquet(files["parquet"], index=False)
    frame = frame.astype({"tenure_months": object})
    frame.loc[2100, "tenure_months"] = "ten"
    frame.to_csv(files["csv"], index=False)
    return files


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_validation_on_ray_reports_what_the_single_process_reports(demo, ray_head, tmp_path, kind):
    """Each block checked on the cluster by the single process's per-chunk code, merged in row order: failures,
    counts, examples and rows are the single process's, a duplicate key split across blocks included (the blocks'
    key hashes meet on the driver, a second pass reports the rows)."""
    path, schema, limits = _bad_table(demo, tmp_path)[kind], load_schema(SCHEMA), ReadLimits(chunk_rows=400)
    local = validate(path, schema, limits=limits)
    with ray_session(ray_head):
        on_ray = validate_on_ray(path, schema, limits=limits)
    assert (on_ray.source, on_ray.n_rows, on_ray.failures) == (local.source, local.n_rows, local.failures)
    # a schema diff line shows a few values of the first chunk that has them: chunking picks them (as locally)
    assert [line.split(" (e.g.")[0] for line in on_ray.schema_diff] == [line.split(" (e.g.")[0]
                                                                         for line in local.schema_diff]
    failed = {(f.column, f.rule): f for f in on_ray.failures}
    customer = failed["customer_id", "unique"]
    assert (customer.count, customer.rows) == (2, [5, 2950])
    assert failed["age", "in_range(18, 100)"].rows == [10, 1500]
    assert failed["contract", "not_nullable"].rows == [800]
    if kind == "csv":
        assert failed["tenure_months", "dtype('int64')"].examples == ["ten"]


def test_kfloop_validate_engine_ray_from_the_command_line(demo, ray_head, tmp_path, capsys):
    args = ["validate", "--data", str(_bad_table(demo, tmp_path)["csv"]), "--schema", SCHEMA, "--json"]
    assert main(args) == EXIT_FINDING
    local = json.loads(capsys.readouterr().out)
    assert main([*args, "--engine", "ray", "--ray-address", ray_head]) == EXIT_FINDING
    on_ray = json.loads(capsys.readouterr().out)
    assert on_ray["failures"] == local["failures"] and on_ray["rows"] == local["rows"] == 3000
