"""Model loading refuses what it must not run: a weights file carrying a pickle payload, a registered version whose
MLmodel points at foreign code; and a static check that nothing on the model path unpickles."""
from __future__ import annotations

import ast
import hashlib
import io
import json
import pickle
from pathlib import Path

import mlflow
import pytest
import torch

from test_registry_versions import build_model, make_frame
from training import checkpoints
from training.model import WEIGHTS_FILE, Predictor

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("training", "monitoring", "components", "pipelines", "data", "benchmarks")


class _WritesSentinel:
    """Unpickling this writes a file: what an attacker's weights would do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "code ran while loading weights"))


def _payloads(sentinel: Path) -> dict[str, bytes]:
    buf = io.BytesIO()
    torch.save({"net.0.weight": _WritesSentinel(sentinel)}, buf)
    return {"pickle": pickle.dumps({"net.0.weight": _WritesSentinel(sentinel)}), "torch.save": buf.getvalue()}


def test_the_payload_is_real(tmp_path):
    """The payloads below do run code when unpickled the unsafe way."""
    for kind, data in _payloads(tmp_path / "ran").items():
        (tmp_path / "ran").unlink(missing_ok=True)
        if kind == "pickle":
            pickle.loads(data)
        else:
            torch.load(io.BytesIO(data), weights_only=False)
        assert (tmp_path / "ran").exists(), kind


@pytest.mark.chaos
@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_weights_carrying_a_pickle_payload_are_refused_without_running_it(tmp_path, kind):
    sentinel = tmp_path / "sentinel"
    model_dir = build_model(tmp_path / "model", make_frame(200, seed=0), steps=1)
    (model_dir / WEIGHTS_FILE).write_bytes(_payloads(sentinel)[kind])
    with pytest.raises(ValueError, match=rf"{WEIGHTS_FILE}: not a safetensors file"):
        Predictor.load(model_dir)
    assert not sentinel.exists()


@pytest.mark.chaos
@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_a_checkpoint_carrying_a_pickle_payload_is_refused_without_running_it(tmp_path, kind):
    sentinel = tmp_path / "sentinel"
    checkpoints.save(tmp_path, 1, {"model": {"w": torch.zeros(3)}}, keep=2)
    data = _payloads(sentinel)[kind]
    checkpoints.tensors_path(tmp_path, 1).write_bytes(data)
    sidecar = checkpoints.sidecar_path(tmp_path, 1)
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "sha256": hashlib.sha256(data).hexdigest()}))
    with pytest.raises(Exception) as refused:
        checkpoints.load(tmp_path, 1)
    assert "safetensors" in type(refused.value).__module__.lower() or "header" in str(refused.value).lower()
    assert not sentinel.exists()


_FOREIGN_CODE = '''
import os
from pathlib import Path
import mlflow

if os.environ.get("FOREIGN_SENTINEL"):
    Path(os.environ["FOREIGN_SENTINEL"]).write_text("foreign model code ran")


class Foreign(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


mlflow.models.set_model(Foreign())
'''


@pytest.mark.chaos
def test_a_version_whose_mlmodel_points_at_foreign_code_is_never_loaded(tmp_path, monkeypatch):
    """A version outside our experiment, logged with its own code but carrying a genuine kfloop model dir and a
    matching weights tag: the evaluator refuses it and never runs its code."""
    from data.fileio import file_digest
    from training.registry.candidates import load_version_predictor
    from training.registry.manifest import MANIFEST_SHA_TAG, MANIFEST_TAG, manifest_sha256
    from training.registry.versions import WEIGHTS_TAG, ForeignModelError, logged_manifest

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    try:
        client = mlflow.MlflowClient()
        model_dir = build_model(tmp_path / "model", make_frame(200, seed=0), steps=1)
        code = tmp_path / "foreign_model.py"
        code.write_text(_FOREIGN_CODE)
        experiment = client.create_experiment("someone-else", artifact_location=(tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            info = mlflow.pyfunc.log_model(name="model", python_model=str(code),
                                           artifacts={"model_dir": str(model_dir)}, pip_requirements=["mlflow"])
        client.create_registered_model("victim")
        sha = file_digest(model_dir / WEIGHTS_FILE)
        manifest = logged_manifest(info.model_uri)  # a manifest of its own: every file matches, the code is foreign
        client.set_tag(run.info.run_id, f"kfloop.{MANIFEST_SHA_TAG}", manifest_sha256(manifest))
        mv = client.create_model_version("victim", source=info.model_uri, run_id=run.info.run_id,
                                         tags={WEIGHTS_TAG: sha, MANIFEST_TAG: manifest}, model_id=info.model_id)
        sentinel = tmp_path / "sentinel"
        monkeypatch.setenv("FOREIGN_SENTINEL", str(sentinel))
        with pytest.raises(ForeignModelError, match=r"victim v1 .*points at code .*foreign_model\.py"):
            load_version_predictor("victim", mv.version)
        assert not sentinel.exists()
    finally:
        mlflow.set_tracking_uri(None)


# ------------------------------------------------------------------------------------------------- static check

_UNSAFE_MODULES = {"pickle", "cloudpickle", "joblib", "dill", "_pickle"}
_UNSAFE_CALLS = {"load", "loads", "Unpickler"}


def _unsafe_loads(path: Path) -> list[str]:
    """``torch.load`` without ``weights_only=True`` and pickle-family loads in one Python file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {}  # local name -> module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                root = node.module.split(".")[0]
                if root in _UNSAFE_MODULES and a.name in _UNSAFE_CALLS:
                    found.append(f"{path}:{node.lineno}: from {node.module} import {a.name}")
                if root == "torch" and a.name == "load":
                    aliases[a.asname or a.name] = "torch.load"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            name = f"{aliases.get(func.value.id, func.value.id)}.{func.attr}"
        elif isinstance(func, ast.Name):
            name = aliases.get(func.id, func.id)
        if name is None:
            continue
        module, _, attr = name.rpartition(".")
        if module.split(".")[0] in _UNSAFE_MODULES and attr in _UNSAFE_CALLS:
            found.append(f"{path}:{node.lineno}: {name}()")
        if name == "torch.load":
            weights_only = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"{path}:{node.lineno}: torch.load() without weights_only=True")
    return found


def test_the_static_check_catches_what_it_is_meant_to(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch, pickle as p\nimport joblib\nfrom cloudpickle import loads\nfrom torch import load\n"
                   "torch.load('w.pt')\ntorch.load('w.pt', weights_only=False)\np.load(f)\njoblib.load('m')\n"
                   "load('x')\ntorch.load('ok.pt', weights_only=True)\n")
    found = _unsafe_loads(bad)
    assert len(found) == 6, found
    assert not any(":10:" in f for f in found)


def test_no_unsafe_deserialisation_on_the_model_path():
    files = [p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py")]
    assert len(files) > 20, "the scan found the sources"
    found = [f for p in files for f in _unsafe_loads(p)]
    assert found == [], "\n".join(found)
