"""Serving a registered version: the loader, the KServe predictor (Open Inference Protocol v2) and the
InferenceService that deploys it."""
