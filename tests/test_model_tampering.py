"""Served models cannot be swapped: every file of a registered version's logged model is hashed into the registry at
registration, and :func:`training.registry.verified.load_verified` (serving) and the evaluation loaders refuse a copy
in the artifact store that differs in any file, naming it, before any of its code runs (issue 41, item 2); and
``kfloop serve-model --model-dir`` refuses a downloaded folder (KServe's ``/mnt/models``) whose files are not those of
the InferenceService's ``serving.kfloop.io/artifact-digest`` (issue 42).

Each test registers its own version on a real SQLite-backed MLflow with a local artifact store, then changes the
stored files the way someone with write access to the artifact store (not the registry) could.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest

from benchmarks.tampering import TAMPERS, stored_model
from test_registry_versions import env  # noqa: F401  (the module's registry and trained model directories)
from training.model import Predictor
from training.model_files import FEATURES_FILE, MODEL_FILE, MODULE_FILE, WEIGHTS_FILE
from training.registry.candidates import load_version_predictor, log_candidate, register_candidate
from training.registry.manifest import (EMPTY_SHA256, MANIFEST_SHA_TAG, MANIFEST_TAG, TamperedModelError,
                                        check_digest, file_manifest, manifest_sha256, tree_digest)
from training.registry.verified import load_verified
from training.registry.versions import ForeignModelError, verified_manifest
from training.serving.load import ModelSource, load_version

REPO = Path(__file__).resolve().parents[1]

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


def _mnt_models(stored: Path, dst: Path) -> Path:
    """``stored``'s non-empty files copied to ``dst``, as KServe's storage initializer downloads them (empty objects
    skipped: kserve v0.20.0 ``kserve_storage.py`` ``_download_s3``)."""
    for path in stored.rglob("*"):
        if path.is_file() and path.stat().st_size:
            target = dst / path.relative_to(stored)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dst


def test_the_digest_leaves_out_empty_files_on_both_sides(tmp_path):
    manifest = {"MLmodel": "a" * 64, "artifacts/w.pt": "b" * 64}
    assert tree_digest({**manifest, "artifacts/empty": EMPTY_SHA256}) == tree_digest(manifest)
    assert tree_digest({**manifest, "artifacts/w.pt": "c" * 64}) != tree_digest(manifest)
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors: {}\n")
    digest = tree_digest(file_manifest(folder))
    (folder / "sub" / "empty").touch()
    check_digest(folder, digest)
    (folder / "sub" / "empty").write_text("x")
    with pytest.raises(TamperedModelError, match=rf"{folder}: its files have digest sha256:\w+ but the registered "
                                                 rf"version's is {digest}"):
        check_digest(folder, digest)


def test_an_untampered_download_with_its_registered_digest_serves(env, tmp_path):
    name = "digest-untampered"
    version, stored = _registered(env, name)
    digest = tree_digest(verified_manifest(name, version))  # what render-serving annotates
    copy = _mnt_models(stored, tmp_path / "mnt-models")
    (copy / "artifacts" / "empty").touch()  # an empty file on the folder's side counts as absent
    rows = env.holdout.drop(columns=["label"]).head(20)
    served = load_version(ModelSource(name, model_dir=str(copy), digest=digest)).predict(rows)
    assert served.equals(load_verified(name, version).predict(rows))
    with pytest.raises(ValueError, match="give a sha256:<64 hex digits> digest with a downloaded model folder"):
        ModelSource(name, model_dir=str(copy), digest="md5:abc")


@pytest.mark.parametrize("tamper", ["a changed byte", "an added file"])
def test_serve_model_refuses_a_tampered_download_naming_both_digests(env, tmp_path, tamper):
    name = "digest-" + tamper.split()[1]
    version, stored = _registered(env, name)
    digest = tree_digest(verified_manifest(name, version))
    copy = _mnt_models(stored, tmp_path / "mnt-models")
    weights = copy / "artifacts" / "good" / WEIGHTS_FILE
    if tamper == "a changed byte":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
    else:
        (copy / "artifacts" / "good" / "extra.py").write_text("import os\n")
    done = subprocess.run([sys.executable, "-m", "pipelines", "serve-model", "--model", name, "--model-dir",
                           str(copy), "--artifact-digest", digest, "--port", "18080", "--grpc-port", "18081"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == TamperedModelError.exit_code, done.stderr[-3000:]
    assert f"{copy}: its files have digest sha256:" in done.stderr and f"registered version's is {digest}" in \
        done.stderr, done.stderr[-3000:]
    assert tree_digest(file_manifest(copy)) in done.stderr and "artifacts/good/" in done.stderr
