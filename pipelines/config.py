"""Turn ``kfloop.yaml`` plus ``--set`` overrides into validated pipeline parameters."""
from __future__ import annotations

import importlib
from typing import Any

SECTIONS: dict[str, tuple[str, str]] = {
    "training": ("training_config", "training.config:TrainingConfig"),
    "promotion": ("promotion_policy", "training.gate:PromotionPolicy"),
    "drift": ("drift_policy", "monitoring.drift:DriftPolicy"),
    "trigger": ("trigger_policy", "monitoring.trigger:TriggerPolicy"),
    "cluster": ("cluster_config", "training.launch.kubernetes:KubernetesSettings"),
}
"""Config section -> (the pipeline's dict parameter, the typed config that validates it)."""

SHARED_KEYS = {"dataset_uri", "current_uri", "reference_uri", "schema_uri", "target", "model_name", "nnodes",
               "nproc_per_node", "backend", "holdout_fraction", "seed"}
"""Parameters of either pipeline; one kfloop.yaml serves both, so each pipeline ignores the other's."""

TRAINING_KEYS = {"training", "promotion", "cluster", "nnodes", "nproc_per_node", "backend", "holdout_fraction", "seed"}
"""Settings the drift pipeline hands to the training runs it triggers."""


def typed_config(section: str, values: dict[str, Any]) -> Any:
    """Build the typed config of ``section`` (it raises ValueError naming the fix)."""
    module, _, cls = SECTIONS[section][1].partition(":")
    return getattr(importlib.import_module(module), cls).from_dict(values)


def pipeline_params(pipeline: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Pick and validate the parameters ``pipeline`` declares from a settings dict.

    Top-level keys are pipeline parameters (``dataset_uri``, ``target``, ``nnodes``...); the sections
    ``training``, ``promotion``, ``drift``, ``trigger`` become dict parameters once their typed config accepts them.

    Raises:
        ValueError: an unknown key, a missing required parameter, or a value a typed config rejects.
    """
    declared = pipeline.component_spec.inputs or {}
    unknown = sorted(set(settings) - set(declared) - set(SECTIONS) - SHARED_KEYS)
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; parameters are {sorted(declared)} and the sections "
                         f"{sorted(SECTIONS)} (e.g. --set training.epochs=5)")
    params: dict[str, Any] = {}
    for key, value in settings.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"'{key}' must be a mapping of settings, e.g. --set {key}.FIELD=VALUE")
            typed_config(key, value)
            if SECTIONS[key][0] in declared:
                params[SECTIONS[key][0]] = value
        elif key in declared:
            params[key] = value
    if "training_params" in declared:  # the drift pipeline's retrain runs get the training settings
        params["training_params"] = {k: v for k, v in settings.items() if k in TRAINING_KEYS}
    missing = [k for k, spec in declared.items() if not spec.optional and k not in params]
    if missing:
        raise ValueError(f"missing required parameter(s) {missing}: pass them with --set KEY=VALUE")
    return params
