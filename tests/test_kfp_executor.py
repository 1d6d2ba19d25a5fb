"""The KFP test server executes what it holds (tests/cluster/kfp_executor.py) with the process engine: small
pipelines through the real ``kfp.Client``; the training pipeline itself is in tests/test_kfp_upload_run.py."""
# kfp reads the components' annotations at definition time: no `from __future__ import annotations` here.

import contextlib
from pathlib import Path

import kfp
import pytest
import yaml
from cluster.k8s_server import K8sServer
from cluster.kfp_executor import ACCESS_LABEL, KfpExecutor, ProcessEngine, unemulated_fields
from cluster.kfp_multiuser import PROFILE_LABELS
from cluster.kfp_server import KfpApiServer
from kfp import compiler, dsl
from kfp import kubernetes as kfp_k8s
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from polling import wait_for

from components import kfp_client

TOKEN = "kfp-executor-token-51d0"
IMAGE = "python:3.11"
PROFILE_MANIFESTS = Path(__file__).resolve().parents[1] / "deploy" / "kubeflow-profile.yaml"
(POD_DEFAULT,) = [d for d in yaml.safe_load_all(PROFILE_MANIFESTS.read_text()) if d["kind"] == "PodDefault"]
"""deploy/kubeflow-profile.yaml's ``access-ml-pipeline`` PodDefault (namespace ``kfloop``)."""


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def produce(word: str, out: dsl.Output[dsl.Dataset]) -> str:
    import os

    with open(out.path, "w") as f:
        f.write(f"{word} from {os.environ['KFP_POD_NAME']} uid {os.environ['KFP_POD_UID']}")
    return word


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def consume(data: dsl.Input[dsl.Dataset], report: dsl.Output[dsl.Artifact]) -> str:
    import os

    token_file = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "/var/run/secrets/kubeflow/pipelines/token")
    token = open(token_file).read() if os.path.exists(token_file) else "no token"
    with open(data.path) as f, open(report.path, "w") as out:
        out.write(f.read() + f"; token {token}")
    return token


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def fail(message: str):
    raise ValueError(message)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def block(flag_dir: str):
    import os
    import time

    open(os.path.join(flag_dir, f"started-{os.getpid()}"), "w").close()
    while True:
        time.sleep(0.05)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def env_of(names: str, out: dsl.Output[dsl.Artifact]):
    import os

    with open(out.path, "w") as f:
        f.write(" ".join(f"{name}={os.environ.get(name, '-')}" for name in names.split()))


@dsl.pipeline(name="secret-env")
def secret_env_pipeline():
    task = env_of(names="URI TOKEN_KEY MISSING_OPTIONAL KF_PIPELINES_SA_TOKEN_PATH").set_caching_options(False)
    kfp_k8s.use_secret_as_env(task, "creds", {"uri": "URI", "token": "TOKEN_KEY"})
    kfp_k8s.use_secret_as_env(task, "creds", {"absent": "MISSING_OPTIONAL"}, optional=True)
    kfp_k8s.add_pod_label(task, ACCESS_LABEL, "true")


@dsl.pipeline(name="own-token-path")
def own_token_path_pipeline():
    task = env_of(names="KF_PIPELINES_SA_TOKEN_PATH").set_caching_options(False)
    kfp_k8s.add_pod_label(task.set_env_variable("KF_PIPELINES_SA_TOKEN_PATH", "/tmp/mine"), ACCESS_LABEL, "true")


@dsl.pipeline(name="if-pipeline")
def if_pipeline(word: str):
    first = produce(word=word)
    first.set_caching_options(False)
    with dsl.If(first.outputs["Output"] == "go"):
        kfp_k8s.add_pod_label(consume(data=first.outputs["out"]).set_caching_options(False), ACCESS_LABEL, "true")


@dsl.pipeline(name="failing")
def failing_pipeline(message: str):
    failed = fail(message=message).set_caching_options(False)
    produce(word="never").set_caching_options(False).after(failed)


@dsl.pipeline(name="blocking")
def blocking_pipeline(flag_dir: str):
    block(flag_dir=flag_dir).set_caching_options(False)


@dsl.pipeline(name="cached")
def cached_pipeline(word: str):
    produce(word=word).set_caching_options(True)


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    with KfpApiServer(token=TOKEN) as server, KfpExecutor(
            server, ProcessEngine(root=tmp_path / "pods"), pipeline_root=tmp_path / "root", namespace="kfloop",
            namespace_labels=PROFILE_LABELS, pod_defaults=[POD_DEFAULT], token=TOKEN) as executor:
        yield server, executor, kfp.Client(host=server.url, existing_token=TOKEN)


def package(pipeline, tmp_path: Path) -> str:
    path = tmp_path / f"{pipeline.name}.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    return str(path)


def start(client, pipeline, tmp_path, **arguments):
    return client.create_run_from_pipeline_package(package(pipeline, tmp_path), arguments=arguments,
                                                   service_account="kfloop").run_id


def finish(client, run_id):
    return kfp_client.wait(client, run_id, poll_seconds=0.02, timeout_seconds=120)


def tasks(run) -> dict[str, object]:
    return {t.display_name: t for t in run.run_details.task_details}


def test_a_run_executes_its_tasks_in_order_with_the_condition_and_artifacts(served, tmp_path):
    server, _, client = served
    run = finish(client, start(client, if_pipeline, tmp_path, word="go"))

    assert run.state == "SUCCEEDED"
    by_name = tasks(run)
    assert {n: t.state for n, t in by_name.items()} == {"produce": "SUCCEEDED", "consume": "SUCCEEDED"}
    reports = list((tmp_path / "root").rglob("report"))
    (text,) = [p.read_text() for p in reports]
    pod = by_name["produce"].pod_name
    assert text.startswith(f"go from {pod} uid ") and text.endswith(f"; token {TOKEN}")
    assert len(text.split(" uid ")[1].split(";")[0]) == 36  # the pod's UID

    skipped = finish(client, start(client, if_pipeline, tmp_path, word="stop"))
    assert skipped.state == "SUCCEEDED"
    assert {n: t.state for n, t in tasks(skipped).items()} == {"produce": "SUCCEEDED", "condition-1": "SKIPPED"}


@pytest.mark.parametrize("pod_defaults, namespace, labels", [
    ([], "kfloop", PROFILE_LABELS),  # no PodDefault: a label alone mounts nothing
    ([POD_DEFAULT], "team-b", PROFILE_LABELS),  # filterPodDefaults: only the pod's own namespace's PodDefaults apply
    ([{**POD_DEFAULT, "spec": {**POD_DEFAULT["spec"], "selector": {"matchExpressions": [
        {"key": ACCESS_LABEL, "operator": "NotIn", "values": ["true"]}]}}}], "kfloop", PROFILE_LABELS),  # the selector
    # the webhook's namespaceSelector: not a profile's namespace (no app.kubernetes.io/part-of), no webhook
    ([POD_DEFAULT], "kfloop", {k: v for k, v in PROFILE_LABELS.items() if k != "app.kubernetes.io/part-of"}),
])
def test_a_labelled_pod_gets_a_token_only_from_a_poddefault_that_selects_it(tmp_path, monkeypatch, pod_defaults,
                                                                             namespace, labels):
    monkeypatch.setenv("HOME", str(tmp_path))
    with KfpApiServer() as server, KfpExecutor(server, ProcessEngine(root=tmp_path / "pods"), namespace=namespace,
                                               namespace_labels=labels, pipeline_root=tmp_path / "root",
                                               pod_defaults=pod_defaults, token=TOKEN):
        client = kfp.Client(host=server.url)
        run = finish(client, start(client, if_pipeline, tmp_path, word="go"))
    assert run.state == "SUCCEEDED"
    (report,) = (tmp_path / "root").rglob("report")
    assert report.read_text().endswith("; token no token")


@pytest.mark.parametrize("with_cluster", [False, True])
def test_a_poddefault_env_var_the_pod_sets_itself_refuses_the_pod_with_or_without_a_cluster(tmp_path, monkeypatch,
                                                                                            with_cluster):
    """``mutatePods``: ``safeToApplyPodDefaultsOnPod`` finds the step's own ``KF_PIPELINES_SA_TOKEN_PATH`` unequal to
    the PodDefault's, and the API server refuses the pod; without a cluster the executor refuses it the same way
    (never overriding the step's variable), and the task fails with the API server's message."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(K8sServer(tmp_path / "k8s", namespace="kfloop")) if with_cluster else None
        server = stack.enter_context(KfpApiServer(token=TOKEN))
        stack.enter_context(KfpExecutor(server, ProcessEngine(root=tmp_path / "pods"), pipeline_root=tmp_path / "root",
                                        namespace="kfloop", namespace_labels=None if cluster else PROFILE_LABELS,
                                        pod_defaults=[POD_DEFAULT], token=TOKEN, cluster=cluster))
        if cluster:
            admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(tmp_path / "admin")))
            kube_client.CoreV1Api(admin).patch_namespace("kfloop", {"metadata": {"labels": PROFILE_LABELS}})
        client = kfp.Client(host=server.url, existing_token=TOKEN)
        run = finish(client, start(client, own_token_path_pipeline, tmp_path))

    (task,) = tasks(run).values()
    assert (run.state, task.state, task.error.message) == ("FAILED", "FAILED", (
        'admission webhook "admission-webhook-deployment.kubeflow.org" denied the request: conflict occurred while '
        f"applying poddefaults: access-ml-pipeline on pod: {task.pod_name} err: merging env for access-ml-pipeline "
        "has a conflict on name KF_PIPELINES_SA_TOKEN_PATH: {'name': 'KF_PIPELINES_SA_TOKEN_PATH', 'value': "
        "'/var/run/secrets/kubeflow/pipelines/token'} does not match {'name': 'KF_PIPELINES_SA_TOKEN_PATH', "
        "'value': '/tmp/mine'}"))
    assert list((tmp_path / "root").rglob("out")) == []


def test_a_poddefault_field_the_executor_does_not_apply_is_refused_by_name(tmp_path):
    secret = {**POD_DEFAULT, "spec": {**POD_DEFAULT["spec"], "annotations": {"a": "b"},
                                      "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}],
                                      "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                                             "key": "key"}}}]}}
    with KfpApiServer() as server, pytest.raises(ValueError) as refused:
        KfpExecutor(server, ProcessEngine(root=tmp_path), pipeline_root=tmp_path, pod_defaults=[secret])
    assert str(refused.value) == ("PodDefault access-ml-pipeline: spec fields ['annotations', 'volumes[creds] (only "
                                  "a projected serviceAccountToken is emulated)', 'env[KEY] (only a value is "
                                  "emulated)'] are not emulated by the test cluster")


@pytest.mark.parametrize("condition, error", [
    ("inputs.parameter_values['pipelinechannel--produce-Outptu'] == 'go'",
     "evaluation error: no such key: pipelinechannel--produce-Outptu"),
    ("lower(inputs.parameter_values['pipelinechannel--produce-Output']) == 'go'",
     "evaluation error: Undefined variable or function: 'lower'"),
])
def test_a_condition_that_cannot_be_evaluated_fails_the_run_not_skips(served, tmp_path, condition, error):
    """driver/dag.go: ``expr.Condition``'s error is returned, failing the task and the run (kfp.local skips)."""
    _, _, client = served
    compiler.Compiler().compile(if_pipeline, str(tmp_path / "if.yaml"))
    spec, platform = yaml.safe_load_all((tmp_path / "if.yaml").read_text())
    task = spec["root"]["dag"]["tasks"]["condition-1"]
    assert task["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--produce-Output'] == 'go'"
    task["triggerPolicy"]["condition"] = condition
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump_all([spec, platform]))
    run = finish(client, client.create_run_from_pipeline_package(str(tmp_path / "bad.yaml"),
                                                                 arguments={"word": "go"}).run_id)
    assert run.state == "FAILED"
    assert {n: t.state for n, t in tasks(run).items()} == {"produce": "SUCCEEDED", "condition-1": "FAILED"}
    assert error in tasks(run)["condition-1"].error.message
    assert run.error.message.startswith("task 'condition-1' failed: evaluation error: ")


@dsl.pipeline(name="unemulated")
def unemulated_pipeline(word: str):
    task = produce(word=word).set_caching_options(False).set_retry(num_retries=2).set_cpu_limit("2")
    kfp_k8s.add_toleration(task, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


def test_a_field_the_executor_does_not_emulate_fails_the_run_naming_it(served, tmp_path):
    """retryPolicy, container.resources, tolerations: KFP would apply them; the executor cannot, so it refuses the
    run instead of running it as if they were absent."""
    _, _, client = served
    run = finish(client, start(client, unemulated_pipeline, tmp_path, word="go"))
    assert run.state == "FAILED" and run.run_details is None  # no task started
    assert run.error.message == (
        "the test executor does not emulate deploymentSpec.executors.exec-produce.container.resources, "
        "root.dag.tasks.produce.retryPolicy, "
        "platforms.kubernetes.deploymentSpec.executors.exec-produce.tolerations: it would ignore them")


@pytest.mark.parametrize("name", ["training", "drift", "quality"])
def test_the_executor_emulates_every_field_of_our_compiled_pipelines(name):
    spec, *platform = yaml.safe_load_all((Path(__file__).resolve().parents[1] / "pipelines" / "compiled"
                                          / f"{name}.yaml").read_text())
    assert unemulated_fields(spec, platform[0] if platform else {}) == []


def test_a_failing_task_fails_the_run_with_its_error_and_stops_the_dag(served, tmp_path):
    _, _, client = served
    run = finish(client, start(client, failing_pipeline, tmp_path, message="column 'age' has nulls"))

    assert run.state == "FAILED"
    failed = [t for t in run.run_details.task_details if t.state == "FAILED"]
    assert len(failed) == 1 and "ValueError: column 'age' has nulls" in failed[0].error.message
    assert "produce" not in tasks(run)  # its upstream failed: never started
    assert "column 'age' has nulls" in run.error.message and failed[0].display_name in run.error.message


def test_terminating_a_run_stops_its_processes(served, tmp_path):
    _, _, client = served
    flags = tmp_path / "flags"
    flags.mkdir()
    run_id = start(client, blocking_pipeline, tmp_path, flag_dir=str(flags))
    (flag,) = wait_for("the task to start", lambda: list(flags.iterdir()))
    pid = int(flag.name.split("-")[1])

    client.terminate_run(run_id)

    run = finish(client, run_id)
    assert run.state == "CANCELED" and tasks(run)["block"].state == "CANCELED"
    assert [h["state"] for h in client.get_run(run_id).to_dict()["state_history"]][-2:] == ["CANCELING", "CANCELED"]
    assert wait_for("the task's process to end", lambda: not Path(f"/proc/{pid}").exists())


def test_a_cached_task_is_skipped_the_second_time(served, tmp_path):
    _, _, client = served
    first = finish(client, start(client, cached_pipeline, tmp_path, word="same"))
    second = finish(client, start(client, cached_pipeline, tmp_path, word="same"))
    third = finish(client, start(client, cached_pipeline, tmp_path, word="other"))
    assert [tasks(r)["produce"].state for r in (first, second, third)] == ["SUCCEEDED", "SKIPPED", "SUCCEEDED"]


def test_a_recurring_run_fires_on_its_cron_within_max_concurrency(served, tmp_path):
    server, _, client = served
    flags = tmp_path / "flags"
    flags.mkdir()
    exp = client.create_experiment("kfloop")
    version = client.upload_pipeline(package(blocking_pipeline, tmp_path), pipeline_name="blocking")
    versions = client.list_pipeline_versions(version.pipeline_id).pipeline_versions
    rec = client.create_recurring_run(exp.experiment_id, "every-second", cron_expression="* * * * * *",
                                      max_concurrency=1, no_catchup=True, params={"flag_dir": str(flags)},
                                      pipeline_id=version.pipeline_id,
                                      version_id=versions[0].pipeline_version_id)

    (flag,) = wait_for("the first fire's task", lambda: list(flags.iterdir()))
    (run,) = [r for r in server.store.runs.values()]
    assert run["recurring_run_id"] == rec.recurring_run_id and run["state"] == "RUNNING"
    client.terminate_run(run["run_id"])  # the next fire may start once the first run ended
    second = wait_for("a second fire", lambda: [f for f in flags.iterdir() if f != flag])
    client.disable_recurring_run(rec.recurring_run_id)
    runs = list(server.store.runs.values())
    assert len(second) == 1 and len(runs) == 2  # max_concurrency 1: no fire while the second one runs
    assert finish(client, run["run_id"]).state == "CANCELED"
    client.terminate_run(runs[1]["run_id"])
    assert finish(client, runs[1]["run_id"]).state == "CANCELED"


def test_a_periodic_recurring_run_fires_every_interval(served, tmp_path):
    server, _, client = served
    exp = client.create_experiment("kfloop")
    version = client.upload_pipeline(package(cached_pipeline, tmp_path), pipeline_name="periodic")
    versions = client.list_pipeline_versions(version.pipeline_id).pipeline_versions
    rec = client.create_recurring_run(exp.experiment_id, "every-second", interval_second=1, max_concurrency=1,
                                      params={"word": "tick"}, pipeline_id=version.pipeline_id,
                                      version_id=versions[0].pipeline_version_id)
    runs = wait_for("two fires", lambda: [r for r in server.store.runs.values() if r["state"] == "SUCCEEDED"][1:])
    client.disable_recurring_run(rec.recurring_run_id)
    assert all(r["recurring_run_id"] == rec.recurring_run_id for r in runs)


def test_the_platform_spec_gives_a_pod_its_secret_env_and_label_and_a_missing_secret_fails_the_task(tmp_path,
                                                                                                     monkeypatch):
    """driver.go's ``extendPodSpecPatch``: ``secretAsEnv`` as ``secretKeyRef`` env (an ``optional`` key that is
    absent stays unset), ``podMetadata`` labels (the access label projects the token); a Secret the namespace lacks
    is the kubelet's CreateContainerConfigError, and the run fails with it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with K8sServer(tmp_path / "k8s", namespace="kfloop") as cluster, KfpApiServer(token=TOKEN) as server, \
            KfpExecutor(server, ProcessEngine(root=tmp_path / "pods"), pipeline_root=tmp_path / "root",
                        namespace="kfloop", pod_defaults=[POD_DEFAULT], token=TOKEN, cluster=cluster):
        admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(tmp_path / "admin")))
        core = kube_client.CoreV1Api(admin)
        core.patch_namespace("kfloop", {"metadata": {"labels": PROFILE_LABELS}})
        client = kfp.Client(host=server.url, existing_token=TOKEN)
        missing = finish(client, start(client, secret_env_pipeline, tmp_path))
        core.create_namespaced_secret("kfloop", {
            "metadata": {"name": "creds"}, "stringData": {"uri": "s3://b/x", "token": "t-1"}})
        run = finish(client, start(client, secret_env_pipeline, tmp_path))

    assert missing.state == "FAILED"
    assert tasks(missing)["env-of"].error.message == 'CreateContainerConfigError: secret "creds" not found'
    assert run.state == "SUCCEEDED"
    (out,) = (tmp_path / "root").rglob("out")
    env = dict(item.split("=", 1) for item in out.read_text().split())
    assert (env["URI"], env["TOKEN_KEY"], env["MISSING_OPTIONAL"]) == ("s3://b/x", "t-1", "-")
    assert Path(env["KF_PIPELINES_SA_TOKEN_PATH"]).read_text() == TOKEN
