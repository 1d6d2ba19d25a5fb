"""The training pipeline's steps as plain functions, a module per step: each component calls one, each runs without
KFP, and a step's process (a fresh interpreter under kfp.local and on KFP) imports only what its own step needs
(splitting a table loads neither torch nor MLflow)."""
