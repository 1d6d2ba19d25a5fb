"""Running pipelines on a Kubeflow Pipelines server."""
