"""The drift and quality pipelines' steps as plain functions: each component calls one, each runs without KFP,
and a step's process imports only what its own step needs (the trigger step's pod does without the champion's
predictor and Evidently)."""
