"""Compile the pipelines to deterministic KFP IR YAML."""
from __future__ import annotations

from pathlib import Path

import yaml
from kfp import compiler, dsl
from kfp.dsl.graph_component import GraphComponent

from data.settings import IMAGE_ENV
from pipelines import kubernetes_options
from pipelines.drift import drift_pipeline
from pipelines.kubernetes_options import KubernetesOptions
from pipelines.quality import quality_pipeline
from pipelines.training import training_pipeline

PIPELINES = {"training": training_pipeline, "drift": drift_pipeline, "quality": quality_pipeline}


def build_pipeline(name: str, options: KubernetesOptions | None = None) -> GraphComponent:
    """The pipeline ``name`` built with ``options`` (credentials Secret, caching, GPU placement of the launch step)
    instead of the defaults it was built with at import.

    Raises:
        KeyError: unknown pipeline name.
    """
    pipeline = PIPELINES[name]
    if options is None or options == KubernetesOptions():
        return pipeline
    with kubernetes_options.using(options):  # rebuild the graph so kubernetes_options.apply() sees them
        return dsl.pipeline(name=pipeline.component_spec.name,
                            description=pipeline.component_spec.description)(pipeline.pipeline_func)


def compile_pipeline(name: str, path: Path, *, image: str | None = None,
                     options: KubernetesOptions | None = None) -> Path:
    """Compile one pipeline; ``image`` replaces every step's container image; ``options`` as
    :func:`build_pipeline`. Every step gets its own image as ``KFLOOP_IMAGE``: the training job it launches runs
    that image unless ``cluster.image`` names another.

    Raises:
        KeyError: unknown pipeline name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(name, options), str(path))
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))  # kfp's summary
    spec, *platform = yaml.safe_load_all(text)  # the pipeline spec, then the Kubernetes platform spec
    for executor in spec["deploymentSpec"]["executors"].values():
        container = executor["container"]
        container["image"] = image or container["image"]
        env = [e for e in container.get("env", []) if e["name"] != IMAGE_ENV]
        container["env"] = [*env, {"name": IMAGE_ENV, "value": container["image"]}]
    path.write_text(header + yaml.safe_dump_all([spec, *platform], sort_keys=True))
    return path


def compile_all(out: Path, *, image: str | None = None, options: KubernetesOptions | None = None) -> list[Path]:
    """Write ``<name>.yaml`` of every pipeline (training, drift, quality) under ``out``."""
    return [compile_pipeline(name, out / f"{name}.yaml", image=image, options=options) for name in PIPELINES]
