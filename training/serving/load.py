"""The one way a served model is loaded: a registered version (by number or alias) or a downloaded model folder
(the storage initializer's ``/mnt/models``), as the MLflow pyfunc every consumer scores with; a registered version
through :func:`training.registry.verified.load_verified` (every file checked against the registry first)."""
from __future__ import annotations

from dataclasses import dataclass

import mlflow

from training.registry.verified import load_verified


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Which model to load: ``model_dir`` when set, else ``model_name`` at ``version`` or ``alias``."""

    model_name: str
    version: str = ""
    alias: str = ""
    model_dir: str = ""

    def __post_init__(self) -> None:
        if bool(self.version) + bool(self.alias) + bool(self.model_dir) != 1:
            raise ValueError(f"model {self.model_name!r}: give exactly one of a version (--version N), an alias "
                             "(--alias champion) or a downloaded model folder (--model-dir DIR)")

def load_version(source: ModelSource) -> mlflow.pyfunc.PyFuncModel:
    """The pyfunc of ``source``: a registered version by :func:`load_verified` (downloaded, every file checked
    against the manifest recorded at registration, then loaded), or the folder ``source.model_dir`` as given.

    Raises:
        training.registry.manifest.TamperedModelError: a file of the version differs from the registry's manifest.
        training.registry.versions.ForeignModelError: the version has no manifest or points at other code.
        mlflow.exceptions.MlflowException: no such version, alias or model folder.
        training.model_files.ModelCodeError: the model's logged code was modified.
    """
    if source.model_dir:
        return mlflow.pyfunc.load_model(source.model_dir)
    return load_verified(source.model_name, source.version or source.alias)
