"""The rollout (issue 42 item 3, training/serving/rollout.py) against the test cluster's KServe
(tests/cluster/kserve_operator.py): champions registered with their artifacts on the S3 test server, each rolled out
as a canary that really serves them (``kfloop serve-model`` pods), smoke-tested, then promoted; a version whose smoke
test fails is rolled back (its traffic to 0, ``champion`` to the version before), and ``kfloop rollback`` moves the
traffic with the alias."""
from __future__ import annotations

import mlflow
import pytest
from kubernetes import client
from serving_versions import register_version

from cluster.kubernetes_cluster import s3_service_account
from pipelines.cli import main
from training.launch.backends import step_backend
from training.launch.cluster import ClusterConfig
from training.registry.versions import champion_history, get_champion, promote
from training.serving.rollout import PROMOTED, ROLLED_BACK, RolloutFailed, rollout
from training.serving.settings import ServingSettings

MODEL = "rollout-churn"
ACCOUNT, SECRET = "kfloop-serving", "kfloop-s3"


@pytest.fixture
def serving(isolated_env, s3_bucket, s3_server, cluster, tmp_path):
    """Serving settings rolling out into the test cluster (its kubeconfig in ``KUBECONFIG``), the S3 service
    account there, the promotion lock, and a way to register and promote a new version (its holdout rows)."""
    s3_service_account(cluster.api(), s3_server.env(), ACCOUNT, SECRET)
    experiment = mlflow.MlflowClient().create_experiment("rollout", artifact_location=f"s3://{s3_bucket}/mlartifacts")
    settings = ServingSettings(log_uri=f"s3://{s3_bucket}/inference", service_account=ACCOUNT, rollout=True,
                               canary_percent=20, rollout_timeout_seconds=180)
    lock = step_backend().promotion_lock(MODEL, isolated_env.workdir)

    def champion(n: int):
        version, rows = register_version(MODEL, experiment_id=experiment, root=tmp_path / f"v{n}")
        current = get_champion(MODEL)
        promote(MODEL, version, compared_against=current.version if current else None, recheck=None, lock=lock)
        return version, rows
    return settings, lock, champion


def _isvc(cluster) -> dict:
    return client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "default", "inferenceservices", MODEL)


def _traffic(cluster) -> list[tuple[str, int]]:
    return [(t["revisionName"], t["percent"]) for t in _isvc(cluster)["status"]["components"]["predictor"]["traffic"]]


def test_a_good_champion_is_promoted_and_one_failing_its_smoke_test_is_rolled_back(serving, cluster, capsys,
                                                                                    monkeypatch):
    settings, lock, champion = serving
    api = cluster.api()
    revision = [f"{MODEL}-predictor-{n:05d}" for n in range(5)]
    v1, rows = champion(1)
    first = rollout(MODEL, v1, serving=settings, cluster=ClusterConfig(), holdout=rows, api=api, lock=lock)
    assert (first.outcome, first.revision) == (PROMOTED, revision[1])
    assert _traffic(cluster) == [(revision[1], 100)]

    v2, rows = champion(2)
    second = rollout(MODEL, v2, serving=settings, cluster=ClusterConfig(), holdout=rows, api=api, lock=lock)
    assert (second.outcome, second.revision) == (PROMOTED, revision[2])
    assert _traffic(cluster) == [(revision[2], 100)]
    assert mlflow.MlflowClient().get_model_version(MODEL, v2).tags["rollout"] == PROMOTED

    v3, rows = champion(3)
    broken = rows.head(5).assign(**{rows.select_dtypes("number").columns[0]: "not a number"})
    with pytest.raises(RolloutFailed, match="smoke test: HTTP 400") as failed:
        rollout(MODEL, v3, serving=settings, cluster=ClusterConfig(), holdout=broken, api=api, lock=lock)
    assert f"champion back to v{v2}" in str(failed.value)
    assert _traffic(cluster) == [(revision[3], 0), (revision[2], 100)]
    assert get_champion(MODEL).version == v2
    assert champion_history(MODEL)[-1].action == "rollback"
    tags = mlflow.MlflowClient().get_model_version(MODEL, v3).tags
    assert (tags["rollout"], tags["rollout_revision"]) == (ROLLED_BACK, revision[3])

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    code = main(["rollback", "--model", MODEL, "--reason", "back to the first", "--set", "serving.rollout=true",
                 "--set", f"serving.log_uri={settings.log_uri}", "--set", f"serving.service_account={ACCOUNT}",
                 "--set", "serving.rollout_timeout_seconds=180"])
    assert code == 0, capsys.readouterr()
    assert get_champion(MODEL).version == v1
    assert _traffic(cluster) == [(revision[4], 100)]
    assert f"traffic on {revision[4]}" in capsys.readouterr().out
