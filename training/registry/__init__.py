"""The MLflow model registry: versions, the champion, its lock."""
