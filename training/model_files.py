"""Names of the files in a kfloop model directory (importable without torch)."""

WEIGHTS_FILE = "weights.safetensors"
"""Final weights, safetensors."""
FEATURES_FILE = "features.json"
"""The fitted :class:`training.features.FeatureTransform`."""
MODEL_FILE = "model.json"
"""Architecture, classes, target, config and metrics; written last, so its presence means complete."""
