"""The config root (pipelines/config.py) and the one section check every typed config shares
(data/settings.py:section_from_dict): a value set once in kfloop.yaml is the value every path uses."""
from __future__ import annotations

import pytest

from data.settings import SECTION_PARAMETERS
from monitoring.drift_policy import DriftPolicy
from monitoring.quality_policy import QualityPolicy
from monitoring.trigger import TriggerPolicy
from pipelines.compile import PIPELINES
from pipelines.config import SECTIONS, job_shape, pipeline_params
from pipelines.drift import drift_pipeline
from pipelines.training import training_pipeline
from training.config import JobShape, ModelSpec, TrainingConfig, TrainingSection
from training.gate import PromotionPolicy
from training.launch.cluster import ClusterConfig
from training.launch.jobspec import JobSpec
from training.launch.kubernetes import KubernetesSettings, in_namespace

DATA = {"dataset_uri": "/data/train.parquet"}


def test_job_shape_in_the_training_section_is_the_pipeline_parameter():
    """The bug of issue 13: ``training: {nproc_per_node: 1}`` lost to the pipeline's default of 2."""
    params = pipeline_params(training_pipeline, {**DATA, "training": {"nproc_per_node": 1, "epochs": 3}})
    assert params["nproc_per_node"] == 1
    assert params["training_config"] == {"epochs": 3}  # one home at run time: the parameter


def test_job_shape_at_the_top_level_still_works_and_both_agreeing_is_fine():
    params = pipeline_params(training_pipeline, {**DATA, "nnodes": 2, "training": {"nnodes": 2, "backend": "local"}})
    assert (params["nnodes"], params["backend"]) == (2, "local")
    assert "nproc_per_node" not in params  # set nowhere: the pipeline's default, which is JobShape's
    assert training_pipeline.component_spec.inputs["nproc_per_node"].default == JobShape().nproc_per_node


def test_job_shape_set_twice_differently_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"nproc_per_node is set twice, to 4 and training.nproc_per_node=1"):
        pipeline_params(training_pipeline, {**DATA, "nproc_per_node": 4, "training": {"nproc_per_node": 1}})


def test_an_invalid_job_shape_in_the_training_section_is_refused():
    with pytest.raises(ValueError, match=r"nproc_per_node=0: use an integer >= 1"):
        pipeline_params(training_pipeline, {**DATA, "training": {"nproc_per_node": 0}})


def test_the_drift_pipeline_hands_the_resolved_shape_to_the_runs_it_triggers():
    settings = {"current_uri": "c.parquet", "reference_uri": "r.parquet", "training": {"nproc_per_node": 1}}
    params = pipeline_params(drift_pipeline, settings)
    assert params["training_params"] == {"nproc_per_node": 1, "training": {}}
    retrain = pipeline_params(training_pipeline, {**DATA, **params["training_params"]})
    assert retrain["nproc_per_node"] == 1


def test_the_drift_engine_reaches_the_registration_of_the_runs_the_drift_pipeline_triggers():
    """``drift.engine`` is the one engine setting: the training pipeline's ``drift_policy`` carries it to the
    registration (its reference profile), also in the training runs a drift check triggers."""
    drift = {"engine": "ray", "ray_address": "ray://head:10001"}
    params = pipeline_params(drift_pipeline, {"current_uri": "c.parquet", "reference_uri": "r.parquet",
                                              "drift": drift})
    assert params["training_params"]["drift"] == drift
    assert pipeline_params(training_pipeline, {**DATA, **params["training_params"]})["drift_policy"] == drift


def test_job_shape_reads_either_place():
    assert job_shape({"training": {"backend": "kubernetes"}, "nnodes": 3}) == {"nnodes": 3, "backend": "kubernetes"}
    assert job_shape({}) == {}


def test_gpu_nodes_run_one_process_per_device_in_the_dry_run_and_the_launch_alike(tmp_path, capsys):
    """The dry run is the launch with GPUs too: ``render-job`` and a pipeline run on Kubernetes resolve the same
    ``nproc_per_node`` (one per GPU, unless set) and so render the very same body."""
    import yaml

    from pipelines.cli.commands import main
    from training.launch.manifests import job_manifest

    cluster = {"gpus_per_node": 4, "shared_volume_claim": "kfloop-shared"}
    settings = {**DATA, "backend": "kubernetes", "nnodes": 2, "training": {"epochs": 3}, "cluster": cluster}
    params = pipeline_params(training_pipeline, settings)
    assert params["nproc_per_node"] == 4
    launched = TrainingSection.from_dict({**params["training_config"], "nnodes": params["nnodes"],
                                          "nproc_per_node": params["nproc_per_node"], "backend": params["backend"]})
    launch = KubernetesSettings.from_dict(params["cluster_config"])
    body = in_namespace(job_manifest(launched.config, launched.shape, launch.cluster, run_id="run-gpu"),
                        launch.launcher.kubeconfig)  # as the launcher submits it: in its own namespace
    config = tmp_path / "kfloop.yaml"
    config.write_text(yaml.safe_dump(settings))
    assert main(["render-job", "--run-id", "run-gpu", "--config", str(config)]) == 0
    assert capsys.readouterr().out == yaml.safe_dump(body, sort_keys=False)
    assert body["spec"]["nprocPerNode"] == "4"
    # set explicitly it wins; on the local backend the cluster's GPUs say nothing about the local ranks
    assert job_shape({**settings, "nproc_per_node": 2}, backend="kubernetes")["nproc_per_node"] == 2
    assert "nproc_per_node" not in job_shape({**settings, "backend": "local"})


def test_every_section_has_one_pipeline_parameter():
    # but ``kfp`` (how pods reach the KFP API): it is pinned with the training version the trigger step starts
    assert set(SECTIONS) - {"kfp"} == set(SECTION_PARAMETERS)
    declared = {name for pipeline in PIPELINES.values() for name in pipeline.component_spec.inputs}
    assert set(SECTION_PARAMETERS.values()) <= declared


@pytest.mark.parametrize(("cls", "section", "values"), [
    (TrainingConfig, "training", {"epochs": True}),
    (JobShape, "training", {"nnodes": True}),
    (TrainingSection, "training", {"max_restarts": True}),
    (ModelSpec, "model", {"module": True}),
    (PromotionPolicy, "promotion", {"bootstrap_samples": True}),
    (DriftPolicy, "drift", {"min_rows": True}),
    (QualityPolicy, "quality", {"max_drop": True}),
    (TriggerPolicy, "trigger", {"cooldown_seconds": True}),
    (ClusterConfig, "cluster", {"gpus_per_node": True}),
])
def test_every_section_refuses_true_as_a_number(cls, section, values):
    with pytest.raises(ValueError, match=rf"{section}\.{next(iter(values))}=.*true/false is not a valid"):
        cls.from_dict(values)


@pytest.mark.parametrize(("cls", "section"), [(TrainingConfig, "training"), (JobShape, "training"),
                                              (TrainingSection, "training"), (PromotionPolicy, "promotion"),
                                              (DriftPolicy, "drift"), (QualityPolicy, "quality"),
                                              (TriggerPolicy, "trigger"),
                                              (ClusterConfig, "cluster")])
def test_every_section_names_an_unknown_key_and_the_valid_ones(cls, section):
    with pytest.raises(ValueError, match=rf"unknown {section} key\(s\) \['nope'\]; valid keys are \["):
        cls.from_dict({"nope": 1})


def test_the_training_section_splits_into_the_model_training_config_and_the_job_shape():
    """One mapping for users; two typed configs for the two readers (train.py and the launchers)."""
    section = TrainingSection.from_dict({"epochs": 3, "nnodes": 2, "max_restarts": 1, "device": "cpu"})
    assert (section.config.epochs, section.config.device) == (3, "cpu")
    assert (section.shape.nnodes, section.shape.max_restarts, section.shape.world_size) == (2, 1, 4)
    assert not {"nnodes", "nproc_per_node", "backend", "max_restarts"} & set(section.config.to_dict())
    assert TrainingSection.from_dict(section.to_dict()) == section
    with pytest.raises(ValueError, match=r"unknown training key\(s\) \['epoch'\]; valid keys are \[.*'epochs'.*"
                                         r"'max_restarts'"):
        TrainingSection.from_dict({"epoch": 3})


def test_the_launcher_section_of_cluster_is_checked_the_same_way():
    with pytest.raises(ValueError, match=r"unknown cluster.launcher key\(s\) \['nope'\]"):
        KubernetesSettings.from_dict({"launcher": {"nope": 1}})


def test_a_section_that_is_not_a_mapping_is_refused():
    with pytest.raises(ValueError, match="'training' must be a mapping"):
        pipeline_params(training_pipeline, {**DATA, "training": 3})


@pytest.mark.parametrize("field", ["nnodes", "nproc_per_node", "rdzv_timeout_seconds", "max_restarts"])
def test_jobspec_refuses_true_as_an_integer(field):
    with pytest.raises(ValueError, match=f"{field}=True"):
        JobSpec(**{field: True})
