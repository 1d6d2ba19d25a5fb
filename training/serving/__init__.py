"""Serving a registered version: the loader, the KServe predictor (Open Inference Protocol v2) and the
InferenceService that deploys it."""

MODEL_NAME_ANNOTATION = "serving.kfloop.io/model-name"
MODEL_VERSION_ANNOTATION = "serving.kfloop.io/model-version"
"""InferenceService annotations (set by ``kfloop render-serving``, listed in its logger's ``metadataAnnotations``)
that every inference-log record carries in ``ce-annotations``: the registered model and version that answered
(:mod:`monitoring.inference_logs` reads them)."""
DIGEST_ANNOTATION = "serving.kfloop.io/artifact-digest"
"""The digest of the version's files (:func:`training.registry.manifest.tree_digest` of its registered manifest);
the predictor checks ``/mnt/models`` against it before loading (``kfloop serve-model --artifact-digest``)."""
