# kfloop: the continuous-training loop on Kubeflow.
PYTHON ?= python3.11
VENV ?= .venv
# torch first, pinned by hash (CPU build; another build: TORCH_LOCK=a file pinning it, TORCH_INDEX=its index), then
# everything else from deploy/lock/dev.txt, pinned with hashes (`make lock` regenerates both kfloop locks from
# pyproject.toml)
TORCH_LOCK ?= deploy/lock/torch-cpu.txt
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
UV_VERSION := 0.9.5
BIN := $(VENV)/bin
export DVC_NO_ANALYTICS := 1
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup lock demo docs test test-docs test-suite e2e e2e-image chaos audit bench bench-scale compile clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes --no-deps --extra-index-url $(TORCH_INDEX) -r $(TORCH_LOCK)
	$(BIN)/pip install --quiet --require-hashes -r deploy/lock/dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip check

# The locks, from pyproject.toml with a pinned uv (in a throwaway venv): deploy/lock/dev.txt (runtime, ray and dev
# extras:
# `make setup`, `make audit`) and deploy/lock/runtime.txt (runtime and ray: the image), the same versions in both, every
# file's sha256 on PyPI, for Linux x86_64 and Python 3.11, resolved against $(TORCH_LOCK)'s torch (fetched by pip,
# hash-checked, and excluded from both locks).
LOCK_COMPILE = "$$tools/bin/uv" pip compile pyproject.toml --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --find-links "$$tools/torch" -c $(TORCH_LOCK) --no-emit-package torch \
	--custom-compile-command "make lock"
lock:
	tools=$$(mktemp -d) && $(PYTHON) -m venv "$$tools" && "$$tools/bin/pip" install --quiet "uv==$(UV_VERSION)" && \
		"$$tools/bin/pip" download --quiet --no-deps --require-hashes --extra-index-url $(TORCH_INDEX) \
			-r $(TORCH_LOCK) -d "$$tools/torch" && \
		$(LOCK_COMPILE) --extra dev -o deploy/lock/dev.txt && \
		$(LOCK_COMPILE) --extra ray -c deploy/lock/dev.txt -o deploy/lock/runtime.txt; rc=$$?; rm -rf "$$tools"; \
		test $$rc -eq 0

demo:
	$(BIN)/kfloop demo

# The docs site first (a broken link, anchor or page fails; not --quiet: it hides the warnings --strict counts),
# built into a temp dir, then the suite on TEST_WORKERS pytest-xdist workers, a test file per worker at a time (its
# module fixtures, such as a Ray head, start once): most tests wait on subprocesses and servers, so two workers
# overlap well on two cores.
TEST_WORKERS ?= 2
test: test-docs test-suite

test-docs:
	site=$$(mktemp -d) && $(BIN)/mkdocs build --strict --site-dir "$$site"; rc=$$?; rm -rf "$$site"; \
		test $$rc -eq 0

test-suite:
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

docs:
	$(BIN)/python docs/generate.py
	$(BIN)/mkdocs serve

# Both pipelines as containers of this commit's image (as root: installs docker.io and debootstrap, runs its own
# dockerd). The docker data root and the wheelhouse stay in KFLOOP_E2E_CACHE (default /var/tmp/kfloop-e2e).
e2e:
	E2E_PYTHON=$(abspath $(BIN))/python deploy/e2e.sh

# Only the image of `make e2e` (daemon, base, wheelhouse, build): .ci/run builds it while the suite runs.
e2e-image:
	E2E_PYTHON=$(abspath $(BIN))/python deploy/e2e.sh image

# The fault-injection tests with their summary, then the hardening report (benchmarks/results/hardening.json): alerts
# answered while 300 slow connections are open, hostile and fuzzed alerts, duplicate retrainings, secrets in output,
# tampered model files; each script exits non-zero when a figure misses its goal.
chaos:
	PYTHONPATH=tests $(BIN)/pytest -q -m chaos -p chaos_report
	$(BIN)/python benchmarks/webhook_load.py
	$(BIN)/python -m benchmarks.hardening

# Known vulnerabilities of the locked pins (what `make setup` and the image install; torch's local version part
# +cpu dropped), from PyPI's advisory data; --strict fails the audit when a pin cannot be looked up (an unreachable
# service never passes silently).
audit:
	cat deploy/lock/dev.txt $(TORCH_LOCK) | sed 's/+[A-Za-z0-9.]* / /' | \
		$(BIN)/pip-audit --strict --progress-spinner off --disable-pip --require-hashes -r /dev/stdin

bench:
	$(BIN)/python benchmarks/loop.py
	$(BIN)/python benchmarks/collectives.py
	$(BIN)/python benchmarks/ddp.py
	$(BIN)/python benchmarks/drift.py
	$(BIN)/python benchmarks/serving.py
	$(BIN)/python benchmarks/quality_calibration.py
	$(BIN)/python benchmarks/summary.py

# Data at scale (issues 17, 30): validation, profile, drift, the Ray engine, training input and Evidently on SCALE_ROWS
# x 20 columns, and the drift check of a SCALE_DRIFT_ROWS file (0 skips it), each in its own capped process; long (the
# data is ~1.1 GB at 10M rows, ~4.8 GB more at 100M), so not part of bench or test.
SCALE_ROWS ?= 10000000
SCALE_DRIFT_ROWS ?= 100000000
bench-scale:
	$(BIN)/python -m benchmarks.scale --rows $(SCALE_ROWS) --drift-rows $(SCALE_DRIFT_ROWS)

compile:
	$(BIN)/kfloop compile --out pipelines/compiled

clean:
	rm -rf .kfloop benchmarks/results
