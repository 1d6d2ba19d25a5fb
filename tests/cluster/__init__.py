"""HTTP test servers that answer like the Kubernetes, KFP and MLflow APIs."""
