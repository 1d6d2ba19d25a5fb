"""Tampered model files (issue 41, item 2): each kind of change someone with write access to the artifact store
(not the registry) could make to a registered version, and whether serving (:func:`training.registry.verified.
load_verified`) and evaluation (:func:`training.registry.candidates.load_version_predictor`) refuse it, naming the
file, before any of its code runs. ``tests/test_model_tampering.py`` and ``benchmarks/hardening.py`` use it.
"""
from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from safetensors.torch import load_file, save_file

from data.fileio import file_digest
from training.config import ModelSpec
from training.features import FeatureTransform, target_classes
from training.gate import PromotionPolicy, evaluate
from training.model import Predictor, save_model_dir
from training.model_code import ModelCode
from training.model_files import FEATURES_FILE, MODEL_FILE, MODULE_FILE, WEIGHTS_FILE
from training.registry.candidates import load_version_predictor, log_candidate, register_candidate
from training.registry.manifest import TamperedModelError
from training.registry.verified import load_verified
from training.registry.versions import Lineage


def _mlmodel(stored: Path, marker: Path) -> None:
    (stored / "MLmodel").write_text((stored / "MLmodel").read_text() + "metadata: {swapped: true}\n")


def _pyfunc_module(stored: Path, marker: Path) -> None:
    module = stored / "pyfunc_model.py"
    module.write_text(module.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")


def _weights(stored: Path, marker: Path) -> None:
    path = next(stored.rglob(WEIGHTS_FILE))
    save_file({k: v * 0 for k, v in load_file(path).items()}, path)


def _features(stored: Path, marker: Path) -> None:
    path = next(stored.rglob(FEATURES_FILE))
    features = json.loads(path.read_text())
    features["numeric"][0]["mean"] += 100.0  # shifts every prediction
    path.write_text(json.dumps(features))


def _threshold(stored: Path, marker: Path) -> None:
    path = next(stored.rglob(MODEL_FILE))
    path.write_text(json.dumps({**json.loads(path.read_text()), "decision_threshold": 0.001}))


def _added(stored: Path, marker: Path) -> None:
    (next(stored.rglob(MODULE_FILE)).parent / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")


def _removed(stored: Path, marker: Path) -> None:
    (stored / "requirements.txt").unlink()


TAMPERS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "MLmodel": (_mlmodel, r"MLmodel has sha256 \w+ but the registry recorded \w+"),
    "pyfunc module": (_pyfunc_module, r"pyfunc_model\.py has sha256 \w+ but the registry recorded \w+"),
    "weights": (_weights, rf"artifacts/\w+/{WEIGHTS_FILE} has sha256 \w+ but the registry recorded \w+"),
    "features.json": (_features, rf"artifacts/\w+/{FEATURES_FILE} has sha256 \w+ but the registry recorded \w+"),
    "model.json (threshold)": (_threshold, rf"artifacts/\w+/{MODEL_FILE} has sha256 \w+ but the registry recorded"),
    "added file": (_added, r"artifacts/\w+/sitecustomize\.py \(sha256 \w+\) is not in the registered manifest"),
    "removed file": (_removed, r"requirements\.txt is missing \(the registry recorded sha256 \w+\)"),
}
"""Kind of change: (how it is made to the stored logged model's folder, given a marker file its code would create;
the regular expression the refusal must match)."""


def stored_model(client: mlflow.MlflowClient, name: str, version: str) -> Path:
    """The folder of the artifact store (a local one) holding version ``version``'s logged model."""
    return Path(client.get_model_version_download_uri(name, version))


def tampered_refusals(name: str, version: str, kind: str, marker: Path) -> dict[str, bool]:
    """After ``kind`` was applied to ``name`` v``version``: whether serving and evaluation each refused it naming the
    file (:data:`TAMPERS`), and whether any code of it ran (``marker`` exists)."""
    refused = {}
    for where, load in (("serving", lambda: load_verified(name, version)),
                        ("evaluation", lambda: load_version_predictor(name, version))):
        try:
            load()
            refused[where] = False
        except TamperedModelError as err:
            refused[where] = re.search(TAMPERS[kind][1], str(err)) is not None
    return {**refused, "code_ran": marker.exists()}


def tiny_model(root: Path) -> tuple[Path, Lineage, dict[str, Any]]:
    """A small untrained kfloop model directory under ``root``, with a lineage and the gate's decision (blessed)
    for :func:`log_candidate` (the data files it names are written under ``root``)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=200), "kind": rng.choice(["a", "b"], 200),
                          "label": rng.choice(["no", "yes"], 200)})
    transform = FeatureTransform.fit(frame, numeric=["x"], categorical=["kind"])
    classes = target_classes(frame["label"])
    code = ModelCode.load(ModelSpec(params={"hidden": [4]}))
    model_dir = save_model_dir(root / "tiny", model=code.build(transform.n_outputs, len(classes)), code=code,
                               n_inputs=transform.n_outputs, n_outputs=len(classes), transform=transform,
                               classes=classes, target="label")
    frame.to_csv(root / "train.csv", index=False)
    decision = evaluate(y_true=frame["label"], challenger_proba=Predictor.load(model_dir).predict_proba(frame),
                        champion_proba=None, classes=classes, holdout=frame,
                        policy=PromotionPolicy(floor=0.0, bootstrap_samples=50))
    lineage = Lineage(data_md5=file_digest(root / "train.csv", "md5"), data_uri=str(root / "train.csv"),
                      holdout_sha256=file_digest(root / "train.csv"), git_commit="0" * 40, pipeline_run_id="hardening",
                      seed=0, schema_yaml="schema_type: dataframe\ncolumns:\n  x: {dtype: float64}\n")
    return model_dir, lineage, decision.to_dict()


def tamper_report(root: Path) -> dict[str, dict[str, bool]]:
    """Register a tiny model once per kind of :data:`TAMPERS` in an MLflow on SQLite under ``root``, apply the kind
    to the stored files, and report :func:`tampered_refusals` per kind; ``untampered`` loads a clean version."""
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    try:
        client = mlflow.MlflowClient()
        experiment = client.create_experiment("hardening", artifact_location=str(root / "mlartifacts"))
        model_dir, lineage, decision = tiny_model(root)
        report = {}
        for i, kind in enumerate(["untampered", *TAMPERS]):
            name = f"tamper-{i}"
            run_id = client.create_run(experiment).info.run_id
            uri = log_candidate(run_id, model_dir, decision=decision, lineage=lineage)
            version = register_candidate(name, run_id=run_id, model_uri=uri, decision=decision, lineage=lineage)
            if kind == "untampered":
                rows = pd.DataFrame({"x": [0.1, -2.0], "kind": ["a", "b"]})
                served = load_verified(name, version).predict(rows)[["proba_no", "proba_yes"]].to_numpy()
                report[kind] = {"loads": bool(np.allclose(served, Predictor.load(model_dir).predict_proba(rows)))}
                continue
            with tempfile.TemporaryDirectory() as tmp:
                marker = Path(tmp) / "code-ran"
                TAMPERS[kind][0](stored_model(client, name, version), marker)
                report[kind] = tampered_refusals(name, version, kind, marker)
        return report
    finally:
        mlflow.set_tracking_uri(None)
