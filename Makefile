# kfloop: the continuous-training loop on Kubeflow.
PYTHON ?= python3.11
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
export DVC_NO_ANALYTICS := 1
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1

.PHONY: setup demo test bench compile clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip check

demo:
	$(BIN)/kfloop demo

test:
	$(BIN)/pytest -q

bench:
	$(BIN)/python benchmarks/loop.py

compile:
	$(BIN)/kfloop compile --out pipelines/compiled

clean:
	rm -rf .kfloop benchmarks/results
