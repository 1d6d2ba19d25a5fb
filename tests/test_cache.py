"""No stale cache: the drift pipeline, run twice by kfp.local with its task cache on, on one URI whose content
changed between the runs, gives the new verdict.

kfp.local 2.17 caches when ``kfp.local.init(enable_caching=True)`` and the task's ``caching_options.enable_cache``
are both set (``kfp/local/orchestrator/task_executor.py``); its key is the component name, image, command,
arguments (parameter values; artifacts by name, URI and metadata) and env (``kfp/local/cache.py``
``LocalCache.compute_key``): never the bytes behind a URI parameter, like the KFP backend's
(``backend/src/v2/cacheutils/cache.go``). (kfp.local also treats an entry as a miss when an output artifact has no
file, ``LocalCache._deserialize_artifact``, which check-drift's Metrics artifact never gets: so the stale hit is
shown here on the key, while the KFP backend, which has no such check, would serve it.)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from kfp import local
from kfp.local.cache import LocalCache

from monitoring.steps.trigger import trigger_step
from pipelines.compile import build_pipeline
from pipelines.kubernetes_options import KubernetesOptions

SCHEMA = str(Path(__file__).resolve().parents[1] / "data" / "schema.yaml")
MODEL = "cache-model"


def _verdicts(pipeline, demo_files, tmp_path) -> list[bool]:
    current = tmp_path / "current.parquet"
    params = {"current_uri": str(current), "reference_uri": str(demo_files["train.parquet"]),
              "schema_uri": SCHEMA, "model_name": MODEL}
    verdicts = []
    for batch in ("batch_stable.parquet", "batch_drifted.parquet"):  # same URI, new content
        shutil.copy(demo_files[batch], current)
        result = pipeline(**params).output
        verdicts.append(json.loads(Path(result.path).read_text())["drifted"])
    return verdicts


def test_a_rerun_on_changed_content_gets_the_new_verdict(isolated_env, demo_files, tmp_path):
    # a recent retrain of the model: the drifted run's trigger step stays in its cooldown instead of training
    trigger_step(model_name=MODEL, data_md5="ea71e7", policy={}, start=lambda: "earlier-run")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"),
               raise_on_error=True, enable_caching=True)
    pipeline = build_pipeline("drift")
    tasks = pipeline.pipeline_spec.root.dag.tasks
    assert not tasks["check-drift"].caching_options.enable_cache
    assert _verdicts(pipeline, demo_files, tmp_path) == [False, True]


def test_the_cache_key_of_a_check_does_not_see_the_content_behind_its_uri(demo_files, tmp_path):
    """What a cacheable check-drift would get: one key for both runs, so the first verdict would be served."""
    spec = build_pipeline("drift", KubernetesOptions(enable_caching=True)).pipeline_spec
    assert spec.root.dag.tasks["check-drift"].caching_options.enable_cache
    container = spec.deployment_spec["executors"]["exec-check-drift"]["container"]
    current = tmp_path / "current.parquet"
    keys = set()
    for batch in ("batch_stable.parquet", "batch_drifted.parquet"):
        shutil.copy(demo_files[batch], current)
        keys.add(LocalCache(str(tmp_path / "cache")).compute_key(
            component_name="comp-check-drift", image=container["image"],
            full_command=[*container["command"], *container["args"]],
            arguments={"current_uri": str(current), "reference_uri": str(demo_files["train.parquet"]),
                       "schema_uri": SCHEMA, "model_name": MODEL, "drift_policy": {}}))
    assert len(keys) == 1
