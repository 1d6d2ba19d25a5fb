"""Names of the files in a kfloop model directory, and the error of its model module (importable without torch)."""
from data.errors import KfloopError

WEIGHTS_FILE = "weights.safetensors"
"""Final weights, safetensors."""
FEATURES_FILE = "features.json"
"""The fitted :class:`training.features.FeatureTransform`."""
MODEL_FILE = "model.json"
"""Architecture, classes, target, config and metrics; written last, so its presence means complete."""
JOB_SHAPE_FILE = "job_shape.json"
"""The shape of the job that trained the model (:class:`training.config.JobShape`), written by the train step; the
registered version's lineage records it."""
MODULE_FILE = "model_module.py"
"""A copy of the model plug-in's module, imported from there (after its sha256 is checked) wherever the model loads."""
MODULE_SHA256_KEY = "model_module_sha256"
"""Where the sha256 of that copy is recorded: the version's tag, the run's ``kfloop.``-prefixed tag and the
logged pyfunc's ``model_config``."""


class ModelCodeError(KfloopError):
    """The model module cannot be used: not found, not importable, changed since it was recorded, or its
    builder does not return a ``torch.nn.Module``."""
