"""The one way a served model is loaded: a registered version (by number or alias) or a downloaded model folder
(the storage initializer's ``/mnt/models``), as the MLflow pyfunc every consumer scores with; a registered version
through :func:`training.registry.verified.load_verified` (every file checked against the registry first), a folder
checked against its registered digest first when one is given."""
from __future__ import annotations

from dataclasses import dataclass

import mlflow

from training.registry.manifest import DIGEST, check_digest
from training.registry.verified import load_verified


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Which model to load: ``model_dir`` when set, else ``model_name`` at ``version`` or ``alias``."""

    model_name: str
    version: str = ""
    alias: str = ""
    model_dir: str = ""
    digest: str = ""
    """``model_dir``'s expected :func:`training.registry.manifest.tree_digest` (``sha256:<hex>``, the
    InferenceService's ``serving.kfloop.io/artifact-digest``); empty: the folder is loaded unchecked."""

    def __post_init__(self) -> None:
        if bool(self.version) + bool(self.alias) + bool(self.model_dir) != 1:
            raise ValueError(f"model {self.model_name!r}: give exactly one of a version (--version N), an alias "
                             "(--alias champion) or a downloaded model folder (--model-dir DIR)")
        if self.digest and not (self.model_dir and DIGEST.match(self.digest)):
            raise ValueError(f"model {self.model_name!r}: artifact digest {self.digest!r}: give a sha256:<64 hex "
                             "digits> digest with a downloaded model folder (--model-dir DIR) only; a registered "
                             "version is verified against the registry's manifest")


def load_version(source: ModelSource) -> mlflow.pyfunc.PyFuncModel:
    """The pyfunc of ``source``: a registered version by :func:`load_verified` (downloaded, every file checked
    against the manifest recorded at registration, then loaded), or the folder ``source.model_dir``, first checked
    against ``source.digest`` when given (:func:`training.registry.manifest.check_digest`).

    Raises:
        training.registry.manifest.TamperedModelError: a file of the version differs from the registry's manifest,
            or the folder's files from the digest given; nothing of them was loaded.
        training.registry.versions.ForeignModelError: the version has no manifest or points at other code.
        mlflow.exceptions.MlflowException: no such version, alias or model folder.
        training.model_files.ModelCodeError: the model's logged code was modified.
    """
    if source.model_dir:
        if source.digest:
            check_digest(source.model_dir, source.digest)
        return mlflow.pyfunc.load_model(source.model_dir)
    return load_verified(source.model_name, source.version or source.alias)
