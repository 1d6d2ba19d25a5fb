"""Compiled IR YAML: deterministic, equal to the golden files, steps in the kfloop image with no pip install."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.compile import PIPELINES, compile_pipeline
from pipelines.kubernetes_options import KubernetesOptions

GOLDEN = Path(__file__).resolve().parents[1] / "pipelines" / "compiled"
VOLATILE = ("sdkVersion",)


def _documents(path: Path) -> list[dict]:
    """The pipeline spec, then the Kubernetes platform spec."""
    return list(yaml.safe_load_all(path.read_text()))


def _stable(path: Path) -> dict:
    spec, *platform = _documents(path)
    for key in VOLATILE:
        spec.pop(key, None)
    return {**spec, "platforms": platform}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_compiled_yaml_matches_golden(name, tmp_path):
    out = compile_pipeline(name, tmp_path / f"{name}.yaml")
    assert _stable(out) == _stable(GOLDEN / f"{name}.yaml"), (
        f"compiled {name} pipeline changed: review and regenerate with `make compile`")


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_steps_run_in_the_image_without_installing_kfp(name, tmp_path):
    spec = _stable(compile_pipeline(name, tmp_path / "p.yaml", image="registry.example/kfloop:abc"))
    executors = spec["deploymentSpec"]["executors"]
    assert executors
    for executor in executors.values():
        container = executor["container"]
        assert container["image"] == "registry.example/kfloop:abc"
        assert "pip install" not in " ".join(container["command"])


def _conditions(spec: dict) -> list[str]:
    tasks = spec["root"]["dag"]["tasks"].values()
    return [t["triggerPolicy"]["condition"] for t in tasks if "triggerPolicy" in t]


def test_branches_are_dsl_if_on_step_outputs(tmp_path):
    training = _stable(compile_pipeline("training", tmp_path / "t.yaml"))
    drift = _stable(compile_pipeline("drift", tmp_path / "d.yaml"))
    assert _conditions(training) == ["inputs.parameter_values['pipelinechannel--evaluate-vs-champion-Output'] == true"]
    assert _conditions(drift) == ["inputs.parameter_values['pipelinechannel--check-drift-Output'] == true"]
    quality = _stable(compile_pipeline("quality", tmp_path / "q.yaml"))
    assert _conditions(quality) == ["inputs.parameter_values['pipelinechannel--check-quality-Output'] == true"]
    trigger = quality["root"]["dag"]["tasks"]["condition-1"]
    assert trigger["inputs"]["parameters"]["pipelinechannel--check-quality-dataset_uri"]["taskOutputParameter"] == {
        "outputParameterKey": "dataset_uri", "producerTask": "check-quality"}


def _k8s_executors(path: Path) -> dict:
    _, platform = _documents(path)
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_gets_the_credentials_secret_by_name(name, tmp_path):
    path = compile_pipeline(name, tmp_path / "p.yaml")
    spec, _ = _documents(path)
    k8s = _k8s_executors(path)
    assert set(k8s) == set(spec["deploymentSpec"]["executors"])
    for executor in k8s.values():
        required, optional = executor["secretAsEnv"]
        assert required["secretName"] == optional["secretName"] == "kfloop-mlflow"
        assert [m["envVar"] for m in required["keyToEnv"]] == ["MLFLOW_TRACKING_URI"] and not required["optional"]
        assert optional["optional"] and {"AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD"} <= {
            m["envVar"] for m in optional["keyToEnv"]}


def test_compile_options_set_the_secret_and_place_only_the_launch_step_on_gpu_nodes(tmp_path):
    options = KubernetesOptions.from_flags(credentials_secret="team-mlflow", gpus=4,
                                           node_selector=["nvidia.com/gpu.present=true"],
                                           tolerations=["nvidia.com/gpu:NoSchedule", "pool=a100:NoExecute"])
    k8s = _k8s_executors(compile_pipeline("training", tmp_path / "t.yaml", options=options))
    assert {e["secretAsEnv"][0]["secretName"] for e in k8s.values()} == {"team-mlflow"}
    placed = {name for name, e in k8s.items() if "nodeSelector" in e or "tolerations" in e}
    assert placed == {"exec-launch-training"}
    launch = k8s["exec-launch-training"]
    assert launch["nodeSelector"] == {"labels": {"nvidia.com/gpu.present": "true"}}
    assert launch["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                     {"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoExecute"}]
    spec, _ = _documents(tmp_path / "t.yaml")
    gpu = {name for name, e in spec["deploymentSpec"]["executors"].items() if "accelerator" in
           e["container"].get("resources", {})}
    assert gpu == {"exec-launch-training"}
    accelerator = spec["deploymentSpec"]["executors"]["exec-launch-training"]["container"]["resources"]["accelerator"]
    assert (accelerator["resourceCount"], accelerator["resourceType"]) == ("4", "nvidia.com/gpu")
    assert "pvcMount" not in launch


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_shared_volume_is_mounted_in_every_step(name, tmp_path):
    """validate, split and check-drift read data on the shared volume as the launch step does."""
    options = KubernetesOptions.from_flags(shared_volume_claim="kfloop-shared", shared_mount_path="/mnt/shared")
    compiled = compile_pipeline(name, tmp_path / "t.yaml", options=options)
    executors = _stable(compiled)["deploymentSpec"]["executors"]
    k8s = _k8s_executors(compiled)
    assert set(k8s) == set(executors)
    for mounts in (e["pvcMount"] for e in k8s.values()):
        [mount] = mounts
        assert mount["mountPath"] == "/mnt/shared"
        assert mount["pvcNameParameter"]["runtimeValue"]["constant"] == "kfloop-shared"
    # the default build is untouched by a compile with options
    assert _stable(compile_pipeline(name, tmp_path / "d.yaml")) == _stable(GOLDEN / f"{name}.yaml")


def test_compile_takes_the_shared_volume_from_the_cluster_settings(tmp_path):
    """One home: the claim the jobs use (cluster.shared_volume_claim) is the one the steps mount; a flag wins."""
    from pipelines.cli import main

    config = tmp_path / "kfloop.yaml"
    config.write_text(yaml.safe_dump({"cluster": {"shared_volume_claim": "team-pvc", "shared_mount_path": "/data"}}))
    assert main(["compile", "--out", str(tmp_path / "settings"), "--config", str(config)]) == 0
    assert main(["compile", "--out", str(tmp_path / "flag"), "--config", str(config),
                 "--shared-volume-claim", "other-pvc"]) == 0
    for folder, claim, path in (("settings", "team-pvc", "/data"), ("flag", "other-pvc", "/data")):
        k8s = _k8s_executors(tmp_path / folder / "training.yaml")
        mounts = [m for e in k8s.values() for m in e["pvcMount"]]
        assert {(m["pvcNameParameter"]["runtimeValue"]["constant"], m["mountPath"]) for m in mounts} == {(claim, path)}
    assert main(["compile", "--out", str(tmp_path / "none")]) == 0
    assert all("pvcMount" not in e for e in _k8s_executors(tmp_path / "none" / "training.yaml").values())


@pytest.mark.parametrize("flags, fix", [
    ({"node_selector": ["gpu"]}, "KEY=VALUE"),
    ({"tolerations": ["nvidia.com/gpu"]}, "KEY:EFFECT"),
    ({"tolerations": ["nvidia.com/gpu:Never"]}, "NoSchedule"),
    ({"credentials_secret": "My_Secret"}, "Kubernetes Secret name"),
    ({"gpus": -1}, "number of GPUs"),
    ({"shared_volume_claim": "Shared_PVC"}, "PersistentVolumeClaim's name"),
    ({"shared_volume_claim": "kfloop-shared", "shared_mount_path": "shared"}, "absolute path"),
])
def test_bad_compile_options_name_the_fix(flags, fix):
    with pytest.raises(ValueError, match=fix):
        KubernetesOptions.from_flags(**flags)


def _caching(spec: dict) -> dict[str, bool]:
    """Task name -> enableCache, in the root DAG and every sub-DAG (dsl.If bodies)."""
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    return {name: task["cachingOptions"].get("enableCache", False) for dag in dags
            for name, task in dag["tasks"].items() if "componentRef" in task and "dag" not in
            spec["components"][task["componentRef"]["name"]]}


def test_steps_that_read_data_or_the_champion_compile_with_caching_off(tmp_path):
    """KFP's cache key (parameters, input artifact names, image, command) misses the content behind a URI and the
    current champion: those steps must never be served from the cache by default (the golden files show it)."""
    training, drift = (_stable(GOLDEN / f"{name}.yaml") for name in ("training", "drift"))
    assert _caching(training) == {"validate-data": False, "split-holdout": False, "launch-training": False,
                                  "evaluate-vs-champion": False, "register-candidate": False, "promote": False,
                                  "rollout": False}
    assert _caching(drift) == {"check-drift": False, "trigger-retraining": False}
    assert _caching(_stable(GOLDEN / "quality.yaml")) == {"check-quality": False, "trigger-retraining": False}


def test_enable_caching_opts_in(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["compile", "--out", str(tmp_path), "--enable-caching"]) == 0
    for name in PIPELINES:
        cached = _caching(_stable(tmp_path / f"{name}.yaml"))
        assert cached and all(cached.values()), cached


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_only_the_trigger_step_carries_the_kfp_api_access_label(name, tmp_path):
    """The `access-ml-pipeline` PodDefault (deploy/kubeflow-profile.yaml) projects the pipelines.kubeflow.org token
    into labelled pods: the trigger step starts runs, no other step gets a KFP API token."""
    k8s = _k8s_executors(GOLDEN / f"{name}.yaml")
    labelled = sorted(label for label, e in k8s.items() if e.get("podMetadata"))
    assert labelled == ([] if name == "training" else ["exec-trigger-retraining"]), labelled
    assert all(k8s[label]["podMetadata"]["labels"] == {"access-ml-pipeline": "true"} for label in labelled)


def test_compile_takes_the_image_from_kfloop_image_unless_given(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    monkeypatch.setenv("KFLOOP_IMAGE", "ghcr.io/team/kfloop:" + "a" * 40)
    assert main(["compile", "--out", str(tmp_path / "env")]) == 0
    assert main(["compile", "--out", str(tmp_path / "flag"), "--image", "registry.example/kfloop:v2"]) == 0
    for folder, image in (("env", "ghcr.io/team/kfloop:" + "a" * 40), ("flag", "registry.example/kfloop:v2")):
        executors = _stable(tmp_path / folder / "drift.yaml")["deploymentSpec"]["executors"].values()
        assert {e["container"]["image"] for e in executors} == {image}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_pulls_with_the_image_pull_secrets_and_knows_its_own_image(name, tmp_path):
    """Issue 32 items 1-2: `--image-pull-secret ghcr` reaches every step's pod (kfp-kubernetes imagePullSecret) and,
    as KFLOOP_IMAGE_PULL_SECRETS, the training job it launches; KFLOOP_IMAGE is the step's own image."""
    image = "ghcr.io/acme/kfloop:" + "c" * 40
    path = compile_pipeline(name, tmp_path / "p.yaml", image=image,
                            options=KubernetesOptions.from_flags(image_pull_secrets=["ghcr", "ghcr", "mirror"]))
    spec, _ = _documents(path)
    k8s = _k8s_executors(path)
    assert set(k8s) == set(spec["deploymentSpec"]["executors"])
    for executor in k8s.values():
        assert [s["secretName"] for s in executor["imagePullSecret"]] == ["ghcr", "mirror"]
    for executor in spec["deploymentSpec"]["executors"].values():
        env = {e["name"]: e["value"] for e in executor["container"]["env"]}
        assert env["KFLOOP_IMAGE"] == executor["container"]["image"] == image
        assert env["KFLOOP_IMAGE_PULL_SECRETS"] == "ghcr,mirror"
    default = _documents(compile_pipeline(name, tmp_path / "d.yaml"))[0]
    for executor in default["deploymentSpec"]["executors"].values():
        assert {e["name"]: e["value"] for e in executor["container"]["env"]} == {
            "KFLOOP_IMAGE": executor["container"]["image"]}


def test_an_image_pull_secret_must_be_a_secret_name():
    with pytest.raises(ValueError, match="GHCR Pull.*Kubernetes Secret name"):
        KubernetesOptions.from_flags(image_pull_secrets=["GHCR Pull"])
