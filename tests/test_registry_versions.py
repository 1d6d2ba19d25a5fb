"""MLflow registry ops on a real SQLite-backed MLflow: register, lineage, promote under a lock, pyfunc, download.

One MLflow DB per module (creating it migrates the schema); every test uses its own registered model name.
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from filelock import FileLock, Timeout
from kubernetes import client, config

from cluster.k8s_rbac import service_account_user
from cluster.k8s_server import K8sServer
from cluster.kubernetes_cluster import grant
from test_registry_lock import _kfloop_role, _without

from data.fileio import file_digest
from data.holdout import write_parquet
from data.schema_rules import SEE_FIRST_ROW
from training.config import ModelSpec
from training.features import FeatureTransform, encode_target, target_classes
from training.gate import Decision, PromotionPolicy, evaluate
from training.model import WEIGHTS_FILE, Predictor, save_model_dir
from training.model_code import ModelCode
from training.model_files import MODULE_FILE, ModelCodeError
from training.registry.manifest import TamperedModelError
from training.registry.candidates import load_version_predictor, log_candidate, register_candidate
from training.registry.versions import (
    MODULE_TAG,
    ChampionInfo,
    Lineage,
    ForeignModelError,
    champion_schema,
    download_model_dir,
    get_champion,
    promote,
)
from training.registry.lock import LeaseLock, LockLost, ensure_held, lease_name
from training.steps.promote import promote_step

NUMERIC, CATEGORICAL, TARGET = ["age", "income"], ["region"], "label"
SCHEMA_YAML = "schema_type: dataframe\ncolumns:\n  age: {dtype: int64}\n"


def make_frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n)
    income = rng.normal(50, 15, n)
    region = rng.choice(np.array(["north", "south", "east", None], dtype=object), n, p=[0.4, 0.3, 0.2, 0.1])
    score = (income - 50) / 15 + (region == "south") * 1.0 + (age > 50) * 0.5
    income[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame({"age": age, "income": income, "region": region,
                         TARGET: np.where(score > 0.3, "yes", "no")})


@dataclass
class Env:
    root: Path
    client: mlflow.MlflowClient
    experiment_id: str
    train: pd.DataFrame
    holdout: pd.DataFrame
    good: Path
    """Trained: clearly better than ``bad``."""
    medium: Path
    """Partly trained: better than ``bad``, worse than ``good``."""
    bad: Path
    """Barely trained: beats the majority-class baseline (as every promoted model must), worse than ``medium``."""

    def run(self) -> str:
        return self.client.create_run(self.experiment_id).info.run_id

    def decide(self, model_dir: Path, champion_dir: Path | None) -> Decision:
        challenger = Predictor.load(model_dir)
        champion = Predictor.load(champion_dir).predict_proba(self.holdout) if champion_dir else None
        return evaluate(y_true=self.holdout[TARGET], challenger_proba=challenger.predict_proba(self.holdout),
                        champion_proba=champion, classes=challenger.classes, holdout=self.holdout,
                        policy=PromotionPolicy(floor=0.3, bootstrap_samples=200, slice_columns=["region"]))

    def candidate(self, name: str, model_dir: Path, *, champion_dir: Path | None = None,
                  previous: str | None = None) -> tuple[str, str, Decision]:
        """Log, gate and register ``model_dir``; returns (version, run_id, decision)."""
        run_id = self.run()
        decision = self.decide(model_dir, champion_dir)
        lineage = self.lineage(previous)
        uri = log_candidate(run_id, model_dir, decision=decision.to_dict(), lineage=lineage)
        version = register_candidate(name, run_id=run_id, model_uri=uri, decision=decision.to_dict(),
                                     lineage=lineage)
        return version, run_id, decision

    def lineage(self, previous: str | None = None) -> Lineage:
        data = self.root / "train.csv"
        if not data.exists():
            self.train.to_csv(data, index=False)
            self.holdout.to_csv(self.root / "holdout.csv", index=False)
        return Lineage(data_md5=file_digest(data, "md5"), data_uri=str(data),
                       holdout_sha256=file_digest(self.root / "holdout.csv"), git_commit="0123abc",
                       pipeline_run_id="run-42", seed=7, schema_yaml=SCHEMA_YAML, previous_champion=previous,
                       training_config={"epochs": 3, "hidden": [8]})


def build_model(model_dir: Path, train: pd.DataFrame, *, steps: int) -> Path:
    torch.manual_seed(0)
    transform = FeatureTransform.fit(train, numeric=NUMERIC, categorical=CATEGORICAL)
    classes = target_classes(train[TARGET])
    code = ModelCode.load(ModelSpec(params={"hidden": [8]}))
    model = code.build(transform.n_outputs, len(classes))
    x = torch.from_numpy(transform.transform(train))
    y = torch.from_numpy(encode_target(train[TARGET], classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return save_model_dir(model_dir, model=model, code=code, n_inputs=transform.n_outputs, n_outputs=len(classes),
                          transform=transform, classes=classes, target=TARGET)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient()
        experiment_id = client.create_experiment("kfloop-tests", artifact_location=str(root / "mlartifacts"))
        train, holdout = make_frame(600, seed=0), make_frame(400, seed=1)
        yield Env(root=root, client=client, experiment_id=experiment_id, train=train, holdout=holdout,
                  good=build_model(root / "good", train, steps=100),
                  medium=build_model(root / "medium", train, steps=8), bad=build_model(root / "bad", train, steps=2))
        mlflow.set_tracking_uri(None)


def test_models_differ_as_the_tests_assume(env):
    assert env.decide(env.bad, None).blessed
    assert env.decide(env.good, env.medium).blessed and env.decide(env.medium, env.bad).blessed
    assert not env.decide(env.medium, env.good).blessed and not env.decide(env.bad, env.good).blessed


def test_candidate_is_registered_with_decision_reason_and_lineage(env):
    version, run_id, decision = env.candidate("reg-lineage", env.good)
    mv = env.client.get_model_version("reg-lineage", version)
    assert mv.status == "READY" and mv.run_id == run_id and mv.description == decision.reason
    assert mv.tags["decision"] == "promote" and mv.tags["reason"] == decision.reason
    lineage = env.lineage()
    assert {k: mv.tags[k] for k in ("data_md5", "holdout_sha256", "git_commit", "pipeline_run_id", "seed",
                                    "previous_champion")} == {
        "data_md5": lineage.data_md5, "holdout_sha256": lineage.holdout_sha256, "git_commit": "0123abc",
        "pipeline_run_id": "run-42", "seed": "7", "previous_champion": "none"}
    assert mv.tags["weights_sha256"] == file_digest(env.good / WEIGHTS_FILE)
    assert mv.tags["kfloop_experiment"] == "kfloop-tests"
    run = env.client.get_run(run_id)
    assert run.data.tags["kfloop.data_md5"] == lineage.data_md5
    assert run.data.metrics["eval_blessed"] == 1.0
    assert run.data.metrics["eval_challenger_accuracy"] == pytest.approx(decision.challenger_metrics["accuracy"])
    assert mlflow.artifacts.load_text(f"runs:/{run_id}/schema.yaml") == SCHEMA_YAML
    assert mlflow.artifacts.load_dict(f"runs:/{run_id}/evaluation.json") == decision.to_dict()
    assert mlflow.artifacts.load_dict(f"runs:/{run_id}/lineage.json")["training_config"] == {"epochs": 3,
                                                                                            "hidden": [8]}


def test_logged_model_is_code_not_pickle(env, tmp_path):
    version, _, _ = env.candidate("reg-nopickle", env.good)
    local = Path(mlflow.artifacts.download_artifacts(f"models:/reg-nopickle/{version}", dst_path=str(tmp_path)))
    files = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    assert "pyfunc_model.py" in files and not [f for f in files if f.endswith((".pkl", ".pickle", ".pt"))]
    mlmodel = (local / "MLmodel").read_text()
    assert "model_code_path" in mlmodel and "python_model.pkl" not in mlmodel
    requirements = (local / "requirements.txt").read_text().split()
    assert any(r.startswith("torch==") for r in requirements) and not [r for r in requirements if "+" in r]


def test_register_is_idempotent_by_run_id(env):
    version, run_id, decision = env.candidate("reg-idem", env.good)
    uri = env.client.get_model_version("reg-idem", version).source
    again = register_candidate("reg-idem", run_id=run_id, model_uri=uri, decision=decision.to_dict(),
                               lineage=env.lineage())
    assert again == version
    assert len(env.client.search_model_versions("name = 'reg-idem'")) == 1


def test_nothing_is_registered_when_registration_cannot_proceed(env):
    from mlflow.exceptions import MlflowException

    run_id = env.run()
    decision = env.decide(env.good, None).to_dict()
    with pytest.raises(ValueError, match=f"run {run_id} has no kfloop.weights_sha256, kfloop.model_module_sha256 or "
                                         "kfloop.artifact_manifest_sha256 tag"):
        register_candidate("reg-refused", run_id=run_id, model_uri="models:/m-0", decision=decision,
                           lineage=env.lineage())
    with pytest.raises(ValueError, match="not a training.gate.Decision.to_dict"):
        register_candidate("reg-refused", run_id=run_id, model_uri="models:/m-0", decision={"blessed": True},
                           lineage=env.lineage())
    with pytest.raises(MlflowException, match="not found"):
        env.client.get_registered_model("reg-refused")


def test_promote_moves_the_alias_and_records_the_previous_champion(env):
    name, calls = "reg-promote", []
    assert get_champion(name) is None and champion_schema(name) is None
    v1, _, _ = env.candidate(name, env.bad)
    first = promote(name, v1, compared_against=None, recheck=calls.append, lock=FileLock(env.root / "promote.lock"))
    assert first.promoted and first.champion_version == v1 and first.previous_champion is None
    v2, run2, decision = env.candidate(name, env.good, champion_dir=env.bad, previous=v1)
    assert decision.blessed
    second = promote(name, v2, compared_against=v1, recheck=calls.append, lock=FileLock(env.root / "promote.lock"))
    assert second.promoted and (second.champion_version, second.previous_champion) == (v2, v1)
    assert second.reason == decision.reason and calls == []
    champion = get_champion(name)
    assert isinstance(champion, ChampionInfo) and (champion.version, champion.run_id) == (v2, run2)
    assert champion.tags["previous_champion"] == v1 and champion.tags["promoted_at"]
    assert champion.metrics["eval_blessed"] == 1.0
    assert env.client.get_registered_model(name).tags["previous_champion"] == v1
    assert champion_schema(name) == SCHEMA_YAML
    retry = promote(name, v2, compared_against=v1, recheck=calls.append, lock=FileLock(env.root / "promote.lock"))
    assert retry.promoted and retry.previous_champion == v1 and "already the champion" in retry.reason


def test_promote_rechecks_against_a_champion_that_changed_meanwhile(env, tmp_path):
    name = "reg-race"
    v1, _, _ = env.candidate(name, env.bad)
    promote(name, v1, compared_against=None, recheck=lambda current: None, lock=FileLock(env.root / "race.lock"))
    # two candidates blessed against v1; the good one is promoted first
    v_medium, _, medium_decision = env.candidate(name, env.medium, champion_dir=env.bad, previous=v1)
    v_good, _, _ = env.candidate(name, env.good, champion_dir=env.bad, previous=v1)
    assert medium_decision.blessed
    promote(name, v_good, compared_against=v1, recheck=lambda current: None, lock=FileLock(env.root / "race.lock"))
    seen: list[ChampionInfo | None] = []

    def recheck(current: ChampionInfo | None) -> Decision:
        seen.append(current)
        champion_dir = download_model_dir(name, current.version, tmp_path / "champion")
        return env.decide(env.medium, champion_dir)

    result = promote(name, v_medium, compared_against=v1, recheck=recheck, lock=FileLock(env.root / "race.lock"))
    assert [c.version for c in seen] == [v_good]
    assert not result.promoted and result.champion_version == v_good
    assert result.reason.startswith(f"superseded: champion changed from v{v1} to v{v_good} since the gate ran")
    assert get_champion(name).version == v_good
    tags = env.client.get_model_version(name, v_medium).tags
    assert tags["decision"] == "superseded" and tags["reason"] == result.reason

    # a stale decision that still holds against the new champion goes through, recording the re-check
    v_also_good, _, _ = env.candidate(name, env.good, champion_dir=env.bad, previous=v1)
    blessed = promote(name, v_also_good, compared_against=v1,
                      recheck=lambda current: SimpleNamespace(blessed=True, reason="still better"),
                      lock=FileLock(env.root / "race.lock"))
    assert blessed.promoted and blessed.previous_champion == v_good
    assert get_champion(name).version == v_also_good
    assert env.client.get_model_version(name, v_also_good).tags["recheck_reason"].endswith("re-check: still better")


def test_the_promote_step_re_decides_with_the_gate_when_the_champion_moved(env, tmp_path, monkeypatch):
    """The promote step's own re-check (the evaluate step's scoring, loaded only for it): a candidate blessed
    against v1 loses to the better champion promoted meanwhile, so ``champion`` stays."""
    monkeypatch.setenv("KFLOOP_HOME", str(tmp_path / "home"))
    name = "reg-step-race"
    v1, _, _ = env.candidate(name, env.bad)
    promote(name, v1, compared_against=None, recheck=lambda current: None, lock=FileLock(env.root / "step.lock"))
    v_medium, _, medium_decision = env.candidate(name, env.medium, champion_dir=env.bad, previous=v1)
    v_good, _, _ = env.candidate(name, env.good, champion_dir=env.bad, previous=v1)
    promote(name, v_good, compared_against=v1, recheck=lambda current: None, lock=FileLock(env.root / "step.lock"))
    holdout = tmp_path / "holdout.parquet"
    sha = write_parquet(env.holdout, holdout)

    result = promote_step(model_name=name, version=v_medium, compared_against=v1, model_dir=str(env.medium),
                          holdout_path=str(holdout), holdout_sha256=sha,
                          policy={"floor": 0.3, "bootstrap_samples": 200, "slice_columns": ["region"]})
    assert medium_decision.blessed and not result.promoted
    assert result.reason.startswith(f"superseded: champion changed from v{v1} to v{v_good} since the gate ran")
    assert get_champion(name).version == v_good


def test_promote_never_moves_the_alias_on_refusal_or_failure(env):
    name = "reg-refuse"
    v1, _, _ = env.candidate(name, env.good)
    promote(name, v1, compared_against=None, recheck=lambda current: None, lock=FileLock(env.root / "refuse.lock"))
    v_rejected, _, decision = env.candidate(name, env.bad, champion_dir=env.good, previous=v1)
    assert not decision.blessed
    with pytest.raises(ValueError, match=f"v{v_rejected} has decision='reject'"):
        promote(name, v_rejected, compared_against=v1, recheck=lambda c: None, lock=FileLock(env.root / "refuse.lock"))

    v_stale, _, _ = env.candidate(name, env.good, champion_dir=env.bad)

    def broken_recheck(current):
        raise RuntimeError("holdout unreadable")

    with pytest.raises(RuntimeError, match="holdout unreadable"):
        promote(name, v_stale, compared_against="99", recheck=broken_recheck, lock=FileLock(env.root / "refuse.lock"))
    with FileLock(env.root / "refuse.lock"), pytest.raises(Timeout):
        promote(name, v_stale, compared_against=v1, recheck=lambda c: None,
                lock=FileLock(env.root / "refuse.lock", timeout=0.1))
    assert get_champion(name).version == v1
    assert env.client.get_model_version(name, v_stale).tags["decision"] == "promote"


@pytest.fixture
def k8s(tmp_path):
    """The test API server (namespace ``ml``): the admin's client, and a client of service account ``kfloop`` with
    deploy/rbac.yaml's Role."""
    with K8sServer(tmp_path / "k8s", namespace="ml", operator=False) as server:
        admin = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "admin")))
        grant(admin, "ml", "kfloop", _kfloop_role())
        runner = server.write_kubeconfig(tmp_path / "runner", user=service_account_user("ml", "kfloop"))
        yield SimpleNamespace(admin=admin, runner=config.new_client_from_config(config_file=str(runner)))


def _stale_candidate(env, name: str) -> tuple[str, str]:
    """A champion v1 and a candidate blessed against another version: promoting it re-checks (the gate) first."""
    v1, _, _ = env.candidate(name, env.bad)
    promote(name, v1, compared_against=None, recheck=lambda c: None, lock=FileLock(env.root / f"{name}.lock"))
    v2, _, _ = env.candidate(name, env.good, champion_dir=env.bad, previous=v1)
    return v1, v2


def test_a_lease_taken_over_between_the_gate_and_the_alias_move_moves_nothing(env, k8s):
    name = "reg-fenced-takeover"
    v1, v2 = _stale_candidate(env, name)
    lock = LeaseLock(name=lease_name(name), namespace="ml", api=k8s.runner, holder="pod-a")

    def gate_while_another_takes_the_lease(current):
        leases = client.CoordinationV1Api(k8s.admin)
        lease = leases.read_namespaced_lease(lock.name, "ml")
        lease.spec.holder_identity = "pod-b"
        leases.replace_namespaced_lease(lock.name, "ml", lease)
        return SimpleNamespace(blessed=True, reason="still better")

    with pytest.raises(LockLost, match="is held by pod-b, no longer by pod-a"):
        promote(name, v2, compared_against="99", recheck=gate_while_another_takes_the_lease, lock=lock)
    assert get_champion(name).version == v1
    assert client.CoordinationV1Api(k8s.admin).read_namespaced_lease(lock.name, "ml").spec.holder_identity == "pod-b"


def test_a_lease_unrenewed_for_its_duration_by_our_clock_moves_nothing(env, k8s):
    name = "reg-fenced-expired"
    v1, v2 = _stale_candidate(env, name)
    lock = LeaseLock(name=lease_name(name), namespace="ml", api=k8s.runner, holder="pod-a", duration_s=1)

    def slow_gate_while_renewals_are_refused(current):
        grant_without_update = _without(_kfloop_role(), "leases", "update")
        client.RbacAuthorizationV1Api(k8s.admin).replace_namespaced_role("kfloop", "ml", {
            **grant_without_update, "metadata": {**grant_without_update["metadata"], "namespace": "ml"}})
        time.sleep(1.5)  # the gate outlasts the Lease's duration: what this test is about, not a synchronisation
        return SimpleNamespace(blessed=True, reason="still better")

    with pytest.raises(LockLost, match="past its duration of 1 s: another promoter may hold it now"):
        promote(name, v2, compared_against="99", recheck=slow_gate_while_renewals_are_refused, lock=lock)
    assert get_champion(name).version == v1


def test_a_file_lock_not_held_is_refused_and_no_other_kind_is_taken(env):
    with pytest.raises(LockLost, match="is not held by this process"):
        ensure_held(FileLock(env.root / "unheld.lock"))
    with pytest.raises(TypeError, match="nullcontext is no promotion lock"):
        ensure_held(nullcontext())


def test_champion_loads_by_alias_and_predicts_raw_rows(env):
    name = "reg-pyfunc"
    v1, _, _ = env.candidate(name, env.good)
    promote(name, v1, compared_against=None, recheck=lambda c: None, lock=FileLock(env.root / "pyfunc.lock"))
    raw = pd.DataFrame({
        "age": [25, 61, 40, 33],                                         # int64, no nulls
        "income": [None, 80.0, 20.0, np.nan],                            # nulls
        "region": pd.Categorical(["south", "mars", None, "north"]),      # unseen category, null, category dtype
        "label": ["yes", "no", "no", "yes"],                            # target and extra columns are ignored
        "customer_id": [1, 2, 3, 4],
    })
    out = mlflow.pyfunc.load_model(f"models:/{name}@champion").predict(raw)
    expected = Predictor.load(env.good).predict_proba(raw)
    assert list(out.columns) == ["prediction", "proba_no", "proba_yes", "schema_violations"] and len(out) == 4
    # the recorded schema knows only age: every other column is flagged, listed once on the first row, and the rows
    # are still scored
    unknown = ", ".join(f"unexpected column {c!r}" for c in ("income", "region", "label", "customer_id"))
    assert out["schema_violations"].tolist() == [f"4 column problem(s): {unknown}", *[SEE_FIRST_ROW] * 3]
    np.testing.assert_allclose(out[["proba_no", "proba_yes"]].to_numpy(), expected, rtol=1e-12)
    assert out["prediction"].tolist() == np.asarray(["no", "yes"], dtype=object)[expected.argmax(1)].tolist()


def test_download_verifies_the_weights_sha256(env, tmp_path):
    name = "reg-download"
    v1, _, _ = env.candidate(name, env.good)
    local = download_model_dir(name, v1, tmp_path / "ok")
    np.testing.assert_array_equal(Predictor.load(local).predict_proba(env.holdout),
                                  Predictor.load(env.good).predict_proba(env.holdout))
    stored = Path(env.client.get_model_version_download_uri(name, v1)) / "artifacts" / env.good.name / WEIGHTS_FILE
    stored.write_bytes(stored.read_bytes()[:-1] + b"\0")
    with pytest.raises(TamperedModelError, match=f"{name} v{v1} .*: artifacts/good/weights.safetensors has sha256"):
        download_model_dir(name, v1, tmp_path / "tampered")
    assert not (tmp_path / "tampered" / "model").exists()

    untagged = env.client.create_model_version(name, source=env.client.get_model_version(name, v1).source)
    with pytest.raises(ForeignModelError, match="has no artifact_manifest tag; refusing"):
        download_model_dir(name, untagged.version, tmp_path / "untagged")


def test_a_tampered_model_module_is_never_imported(env, tmp_path):
    name = "reg-module"
    v1, _, _ = env.candidate(name, env.good)
    recorded = env.client.get_model_version(name, v1).tags[MODULE_TAG]
    assert recorded == file_digest(env.good / MODULE_FILE)
    stored = Path(env.client.get_model_version_download_uri(name, v1)) / "artifacts" / env.good.name / MODULE_FILE
    marker = tmp_path / "imported"
    stored.write_text(stored.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    with pytest.raises(TamperedModelError, match=f"{name} v{v1} .*: artifacts/good/model_module.py has sha256 .* "
                                                 "but the registry recorded"):
        load_version_predictor(name, v1)
    with pytest.raises(ModelCodeError, match=f"model module has sha256 .* but {recorded} was recorded"):
        mlflow.pyfunc.load_model(f"models:/{name}/{v1}")
    assert not marker.exists()  # refused before a line of it ran


def test_lineage_rejects_malformed_hashes():
    with pytest.raises(ValueError, match="data_md5='abc': expected 32 lowercase hex digits"):
        Lineage(data_md5="abc", data_uri="d.csv", holdout_sha256="0" * 64, git_commit="x", pipeline_run_id="r",
                seed=1, schema_yaml="s: 1")
    lineage = Lineage(data_md5="0" * 32, data_uri="d.csv", holdout_sha256="0" * 64, git_commit="x",
                      pipeline_run_id="r", seed=1, schema_yaml="s: 1")
    assert json.loads(json.dumps(lineage.to_dict()))["previous_champion"] is None
    assert lineage.tags()["previous_champion"] == "none"
