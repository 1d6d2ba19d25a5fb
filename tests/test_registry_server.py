"""The registry against one real ``mlflow server`` process: promotion races, the decision table, MLflow failing
between registering and moving the alias (503 / dropped connections from a proxy in front of the server), and
rollback with every consumer resolving ``models:/<name>@champion``.
"""
from __future__ import annotations

import threading
from pathlib import Path

import mlflow
import numpy as np
import pytest
from filelock import FileLock
import torch
from test_registry_versions import TARGET, Env, build_model, make_frame

from cluster.mlflow_server import Fault, FaultProxy
from training.config import ModelSpec
from training.model import Predictor, save_model_dir
from training.model_code import ModelCode
from training.registry.candidates import register_candidate
from training.registry.manifest import TamperedModelError
from training.registry.versions import (
    RegistryUnavailableError,
    champion_history,
    download_model_dir,
    get_champion,
    promote,
    rollback,
    verify_version,
)


@pytest.fixture(scope="module")
def served(mlflow_server, tmp_path_factory):
    """An :class:`test_registry_versions.Env` whose MLflow is the shared server."""
    root = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
        mlflow.set_tracking_uri(mlflow_server.url)
        client = mlflow.MlflowClient()
        experiment_id = client.create_experiment("kfloop-served")
        train, holdout = make_frame(600, seed=0), make_frame(400, seed=1)
        yield Env(root=root, client=client, experiment_id=experiment_id, train=train, holdout=holdout,
                  good=build_model(root / "good", train, steps=100),
                  medium=build_model(root / "medium", train, steps=8), bad=build_model(root / "bad", train, steps=2))
        mlflow.set_tracking_uri(None)


@pytest.fixture
def fast_retries(monkeypatch):
    """MLflow's own bounded retries, made quick: 2 retries, no backoff."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


@pytest.fixture
def proxy(mlflow_server):
    p = FaultProxy(upstream=mlflow_server.url).start()
    yield p
    p.stop()


def _first_champion(env: Env, name: str, model_dir: Path) -> str:
    v1, _, _ = env.candidate(name, model_dir)
    assert promote(name, v1, compared_against=None, recheck=_never, lock=FileLock(env.root / f"{name}.lock")).promoted
    return v1


def _never(current):
    raise AssertionError(f"no re-check expected (champion {current})")


def _recheck_with_gate(env: Env, name: str, model_dir: Path, tmp: Path):
    """The real re-check: score ``model_dir`` against whatever is champion now."""
    def recheck(current):
        champion_dir = download_model_dir(name, current.version, tmp / f"champion-v{current.version}")
        return env.decide(model_dir, champion_dir)
    return recheck


@pytest.mark.chaos
def test_two_promotions_race_and_the_better_one_wins(served, tmp_path):
    name = "srv-race"
    v1 = _first_champion(served, name, served.bad)
    v2, _, d2 = served.candidate(name, served.good, champion_dir=served.bad, previous=v1)
    v3, _, d3 = served.candidate(name, served.medium, champion_dir=served.bad, previous=v1)
    assert d2.blessed and d3.blessed  # both beat v1; only v2 beats the other
    start, results = threading.Barrier(2), {}

    def race(version, model_dir):
        recheck = _recheck_with_gate(served, name, model_dir, tmp_path / version)
        start.wait()
        results[version] = promote(name, version, compared_against=v1, recheck=recheck,
                                   lock=FileLock(served.root / f"{name}.lock"), client=mlflow.MlflowClient())

    threads = [threading.Thread(target=race, args=a) for a in ((v2, served.good), (v3, served.medium))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(results) == {v2, v3}
    assert get_champion(name).version == v2 and results[v2].promoted
    moves = [(m.version, m.previous, m.action) for m in champion_history(name)]
    v3_tags = served.client.get_model_version(name, v3).tags
    if not results[v3].promoted:  # v2 took the lock first: v3 re-checked against v2 and lost
        assert v3_tags["decision"] == "superseded"
        assert v3_tags["reason"].startswith(f"superseded: champion changed from v{v1} to v{v2} since the gate ran")
        assert moves == [(v1, None, "promote"), (v2, v1, "promote")]
    else:  # v3 took the lock first; v2's re-check against v3 still blessed it
        assert moves == [(v1, None, "promote"), (v3, v1, "promote"), (v2, v3, "promote")]
        assert served.client.get_model_version(name, v2).tags["recheck_reason"]
    assert served.client.get_model_version(name, v2).tags["previous_champion"] == moves[-1][1]


def _nan_model(model_dir: Path, like: Path) -> Path:
    predictor = Predictor.load(like)
    with torch.no_grad():
        for p in predictor.model.parameters():
            p.fill_(float("nan"))
    n_inputs, n_outputs = predictor.transform.n_outputs, len(predictor.classes)
    return save_model_dir(model_dir, model=predictor.model, code=ModelCode.load(ModelSpec(params={"hidden": [8]})),
                          n_inputs=n_inputs, n_outputs=n_outputs, transform=predictor.transform,
                          classes=predictor.classes, target=TARGET)


@pytest.mark.parametrize("case", ["no champion", "worse", "tie", "nan metric", "missing metric"])
def test_decision_table(served, case, tmp_path):
    name = f"srv-table-{case.replace(' ', '-')}"
    if case == "no champion":
        version, _, decision = served.candidate(name, served.medium)
        assert decision.blessed and decision.reason.endswith("(no champion)")
        assert promote(name, version, compared_against=None, recheck=_never,
                       lock=FileLock(tmp_path / "lock")).promoted
        assert get_champion(name).version == version
        return
    v1 = _first_champion(served, name, served.good)
    if case == "missing metric":
        run_id = served.run()
        decision = served.decide(served.good, served.bad).to_dict()
        del decision["challenger_metrics"]["accuracy"]
        with pytest.raises(ValueError, match="primary metric 'accuracy' is missing; a missing or NaN metric never"):
            register_candidate(name, run_id=run_id, model_uri="models:/m-0", decision=decision,
                               lineage=served.lineage())
        assert len(served.client.search_model_versions(f"name = '{name}'")) == 1
        return
    model_dir = (_nan_model(tmp_path / "nan", served.good) if case == "nan metric" else
                 {"worse": served.bad, "tie": served.good}[case])
    version, _, decision = served.candidate(name, model_dir, champion_dir=served.good, previous=v1)
    expected = {"worse": "accuracy 0.", "tie": "is a tie; the incumbent stays", "nan metric": "is undefined"}[case]
    assert not decision.blessed and expected in decision.reason
    assert served.client.get_model_version(name, version).tags["decision"] == "reject"
    with pytest.raises(ValueError, match="only a version the gate blessed"):
        promote(name, version, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"))
    assert get_champion(name).version == v1 and len(champion_history(name)) == 1


@pytest.mark.chaos
def test_503_on_the_alias_move_fails_clearly_and_a_rerun_completes(served, proxy, fast_retries, tmp_path):
    name = "srv-503"
    v1 = _first_champion(served, name, served.bad)
    flaky = mlflow.MlflowClient(tracking_uri=proxy.url)
    run_id = served.run()
    decision = served.decide(served.good, served.bad)
    lineage = served.lineage(v1)
    from training.registry.candidates import log_candidate

    uri = log_candidate(run_id, served.good, decision=decision.to_dict(), lineage=lineage)
    v2 = register_candidate(name, run_id=run_id, model_uri=uri, decision=decision.to_dict(), lineage=lineage,
                            client=flaky)
    fault = Fault(path="/registered-models/alias")
    proxy.faults.append(fault)
    with pytest.raises(RegistryUnavailableError, match=f"did not answer for {name}.*still points at a valid"):
        promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"), client=flaky)
    assert fault.hits == 3  # one try and MLFLOW_HTTP_REQUEST_MAX_RETRIES=2 retries, then the clear failure
    assert get_champion(name).version == v1
    verify_version(name, v1)
    assert "promoted_at" not in served.client.get_model_version(name, v2).tags

    proxy.faults.clear()  # MLflow is back: the pipeline re-runs register and promote
    again = register_candidate(name, run_id=run_id, model_uri=uri, decision=decision.to_dict(), lineage=lineage,
                               client=flaky)
    assert again == v2 and len(served.client.search_model_versions(f"run_id = '{run_id}'")) == 1
    result = promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"), client=flaky)
    assert result.promoted and get_champion(name).version == v2
    assert [(m.version, m.previous) for m in champion_history(name)] == [(v1, None), (v2, v1)]


@pytest.mark.chaos
def test_connection_dropped_after_the_alias_moved_is_repaired_by_the_rerun(served, proxy, fast_retries, tmp_path):
    name = "srv-drop"
    v1 = _first_champion(served, name, served.bad)
    v2, _, _ = served.candidate(name, served.good, champion_dir=served.bad, previous=v1)
    flaky = mlflow.MlflowClient(tracking_uri=proxy.url)
    fault = Fault(path="/registered-models/set-tag", action="drop")  # the server "dies" right after the alias
    proxy.faults.append(fault)
    with pytest.raises(RegistryUnavailableError):
        promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"), client=flaky)
    assert 1 <= fault.hits <= 3
    assert get_champion(name).version == v2  # the alias moved and points at a valid, verified version
    verify_version(name, v2)
    assert [m.version for m in champion_history(name)] == [v1]

    proxy.faults.clear()
    result = promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"), client=flaky)
    assert result.promoted and result.previous_champion == v1 and "already the champion" in result.reason
    assert [(m.version, m.previous, m.action) for m in champion_history(name)] == [(v1, None, "promote"),
                                                                                   (v2, v1, "promote")]
    again = promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"))
    assert again.promoted and len(champion_history(name)) == 2


def test_rollback_moves_champion_back_and_every_consumer_follows(served, tmp_path):
    from monitoring.steps.checks import drift_step
    from training.steps.evaluate import score_against_champion
    from data.validation import infer_schema, schema_to_yaml

    name = "srv-rollback"
    v1 = _first_champion(served, name, served.medium)
    v2, _, _ = served.candidate(name, served.good, champion_dir=served.medium, previous=v1)
    promote(name, v2, compared_against=v1, recheck=_never, lock=FileLock(tmp_path / "lock"))
    result = rollback(name, reason="v2 mispredicts on the new region", actor="alice", lock=FileLock(tmp_path / "lock"))
    assert (result.champion_version, result.previous_champion) == (v1, v2)
    assert get_champion(name).version == v1
    last = champion_history(name)[-1]
    assert (last.version, last.previous, last.action, last.actor) == (v1, v2, "rollback", "alice")
    assert last.reason == "v2 mispredicts on the new region"
    assert served.client.get_model_version(name, v2).tags["rollback_reason"] == last.reason

    # consumers: pyfunc by alias, the evaluation gate and the drift check all use v1 now
    served.lineage()
    rows = served.holdout.drop(columns=[TARGET]).head(20)
    np.testing.assert_allclose(
        mlflow.pyfunc.load_model(f"models:/{name}@champion").predict(rows).filter(like="proba_").to_numpy(),
        Predictor.load(served.medium).predict_proba(rows), rtol=1e-12)
    holdout = served.root / "holdout.csv"
    from data.fileio import file_digest

    decision, champion = score_against_champion(model_dir=str(served.good), holdout_path=str(holdout),
                                                holdout_sha256=file_digest(holdout), model_name=name,
                                                policy={"bootstrap_samples": 50})
    assert champion.version == v1
    assert decision.champion_metrics == served.decide(served.good, served.medium).champion_metrics
    schema = tmp_path / "schema.yaml"
    schema.write_text(schema_to_yaml(infer_schema(served.train, target=TARGET)))
    drift = drift_step(current_uri=str(holdout), reference_uri=str(served.root / "train.csv"),
                       schema_uri=str(schema), model_name=name, policy={}, report_out="")
    assert drift.champion_version == v1

    # the default target is the champion the current one replaced (v1 replaced nobody)
    with pytest.raises(ValueError, match=f"v{v1} replaced no recorded champion; pass --to VERSION"):
        rollback(name, reason="again", actor="alice", lock=FileLock(tmp_path / "lock"))


@pytest.mark.chaos
def test_rollback_refuses_targets_that_must_not_serve(served, mlflow_server, tmp_path):
    name = "srv-rollback-refused"
    v1 = _first_champion(served, name, served.good)
    rejected, _, _ = served.candidate(name, served.bad, champion_dir=served.good, previous=v1)
    source = served.client.get_model_version(name, v1).source
    outside = served.client.create_model_version(name, source=source, model_id=source.removeprefix("models:/"))
    lock = tmp_path / "lock"
    with pytest.raises(ValueError, match="a rollback needs a reason"):
        rollback(name, to=rejected, reason=" ", actor="bob", lock=FileLock(lock))
    with pytest.raises(ValueError, match=f"v{rejected} has decision='reject'"):
        rollback(name, to=rejected, reason="test", actor="bob", lock=FileLock(lock))
    served.client.set_model_version_tag(name, outside.version, "decision", "promote")
    with pytest.raises(ValueError, match="not logged by a run of kfloop experiment None"):
        rollback(name, to=outside.version, reason="test", actor="bob", lock=FileLock(lock))
    with pytest.raises(ValueError, match=f"v{v1} is already the champion"):
        rollback(name, to=v1, reason="test", actor="bob", lock=FileLock(lock))

    tampered, _, _ = served.candidate(name, served.medium, champion_dir=served.bad)
    promote(name, tampered, compared_against=v1, recheck=lambda c: served.decide(served.medium, served.bad),
            lock=FileLock(lock))
    v_good, _, _ = served.candidate(name, served.good, champion_dir=served.medium, previous=tampered)
    promote(name, v_good, compared_against=tampered, recheck=_never, lock=FileLock(lock))
    stored = [p for p in (mlflow_server.root / "artifacts").rglob("weights.safetensors")
              if _logged_by(served, name, tampered, p)]
    assert len(stored) == 1
    stored[0].write_bytes(stored[0].read_bytes()[:-1] + b"\0")
    with pytest.raises(TamperedModelError, match="weights.safetensors has sha256"):
        rollback(name, reason="test", actor="bob", lock=FileLock(lock))
    assert get_champion(name).version == v_good and champion_history(name)[-1].version == v_good


def _logged_by(env: Env, name: str, version: str, path: Path) -> bool:
    """Whether ``path`` lies under the logged model of ``version`` (artifacts are stored by model id)."""
    source = env.client.get_model_version(name, version).source  # models:/m-<id>
    return source.removeprefix("models:/") in str(path)
