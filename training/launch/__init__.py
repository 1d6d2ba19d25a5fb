"""Launch infrastructure: the job spec, its local and Kubernetes renderings, the cluster config."""
