"""Served models cannot be swapped: every file of a registered version's logged model is hashed into the registry at
registration, and :func:`training.registry.verified.load_verified` (serving) and the evaluation loaders refuse a copy
in the artifact store that differs in any file, naming it, before any of its code runs (issue 41, item 2).

Each test registers its own version on a real SQLite-backed MLflow with a local artifact store, then changes the
stored files the way someone with write access to the artifact store (not the registry) could.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest

from benchmarks.tampering import TAMPERS, stored_model
from test_registry_versions import env  # noqa: F401  (the module's registry and trained model directories)
from training.model import Predictor
from training.model_files import FEATURES_FILE, MODEL_FILE, MODULE_FILE, WEIGHTS_FILE
from training.registry.candidates import load_version_predictor, log_candidate, register_candidate
from training.registry.manifest import MANIFEST_SHA_TAG, MANIFEST_TAG, TamperedModelError, manifest_sha256
from training.registry.verified import load_verified
from training.registry.versions import ForeignModelError

pytestmark = pytest.mark.chaos


def _registered(env, name: str) -> tuple[str, Path]:
    """A fresh version of ``env.good`` under ``name``: (version, the stored logged model's folder)."""
    version, _, _ = env.candidate(name, env.good)
    return version, stored_model(env.client, name, version)


@pytest.mark.parametrize("kind", TAMPERS)
def test_a_tampered_file_is_refused_by_serving_and_evaluation_naming_it(env, tmp_path, kind):
    name = f"tamper-{kind.split()[0].replace('.', '-').lower()}"
    version, stored = _registered(env, name)
    tamper, names_it = TAMPERS[kind]
    marker = tmp_path / "code-ran"
    tamper(stored, marker)
    with pytest.raises(TamperedModelError, match=rf"{name} v{version} \(.*\): {names_it}"):
        load_verified(name, version)
    with pytest.raises(TamperedModelError, match=names_it):
        load_version_predictor(name, version)
    assert not marker.exists()  # refused before a line of it ran


def test_an_untampered_version_serves_as_before(env, tmp_path):
    name = "tamper-none"
    version, _ = _registered(env, name)
    env.client.set_registered_model_alias(name, "champion", version)
    mv = env.client.get_model_version(name, version)
    manifest = json.loads(mv.tags[MANIFEST_TAG])
    assert {"MLmodel", "pyfunc_model.py", "requirements.txt", f"artifacts/good/{WEIGHTS_FILE}",
            f"artifacts/good/{FEATURES_FILE}", f"artifacts/good/{MODEL_FILE}",
            f"artifacts/good/{MODULE_FILE}"} <= manifest.keys()
    assert env.client.get_run(mv.run_id).data.tags[f"kfloop.{MANIFEST_SHA_TAG}"] == manifest_sha256(
        mv.tags[MANIFEST_TAG])
    rows = env.holdout.drop(columns=["label"]).head(50)
    served = load_verified(name, "champion").predict(rows)
    unverified = mlflow.pyfunc.load_model(f"models:/{name}/{version}").predict(rows)
    assert served.equals(unverified)
    np.testing.assert_allclose(served[["proba_no", "proba_yes"]].to_numpy(),
                               Predictor.load(env.good).predict_proba(rows), rtol=1e-12)
    np.testing.assert_array_equal(load_version_predictor(name, version).predict_proba(rows),
                                  Predictor.load(env.good).predict_proba(rows))


def test_a_manifest_rewritten_in_the_registry_or_missing_is_refused(env):
    name = "tamper-manifest"
    version, stored = _registered(env, name)
    TAMPERS["weights"][0](stored, stored / "unused")
    forged = json.loads(env.client.get_model_version(name, version).tags[MANIFEST_TAG])
    forged[f"artifacts/good/{WEIGHTS_FILE}"] = "0" * 64
    env.client.set_model_version_tag(name, version, MANIFEST_TAG, json.dumps(forged))
    with pytest.raises(ForeignModelError, match=rf"{name} v{version}: its {MANIFEST_TAG} tag has sha256 \w+ but its "
                                                r"run \w+ recorded \w+"):
        load_verified(name, version)
    env.client.delete_model_version_tag(name, version, MANIFEST_TAG)
    with pytest.raises(ForeignModelError, match=f"{name} v{version} has no {MANIFEST_TAG} tag; refusing"):
        load_verified(name, version)


def test_a_model_changed_between_logging_and_registration_is_not_registered(env):
    run_id = env.run()
    decision = env.decide(env.good, None).to_dict()
    uri = log_candidate(run_id, env.good, decision=decision, lineage=env.lineage())
    stored = Path(env.client.get_logged_model(uri.removeprefix("models:/")).artifact_location)
    TAMPERS["weights"][0](stored, stored / "unused")
    with pytest.raises(TamperedModelError, match=rf"{uri}: its files' manifest has sha256 \w+ but run {run_id} "
                                                 r"recorded \w+ when it was logged"):
        register_candidate("tamper-before-registration", run_id=run_id, model_uri=uri, decision=decision,
                           lineage=env.lineage())
    assert not env.client.search_model_versions("name = 'tamper-before-registration'")
