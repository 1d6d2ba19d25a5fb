"""Running pipelines on this machine with kfp.local."""
