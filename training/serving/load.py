"""The one way a served model is loaded: a registered version (by number or alias) or a downloaded model folder
(the storage initializer's ``/mnt/models``), as the MLflow pyfunc every consumer scores with."""
from __future__ import annotations

from dataclasses import dataclass

import mlflow


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

    @property
    def uri(self) -> str:
        """What :func:`mlflow.pyfunc.load_model` loads."""
        if self.model_dir:
            return self.model_dir
        return f"models:/{self.model_name}/{self.version}" if self.version else f"models:/{self.model_name}@{self.alias}"


def load_version(source: ModelSource) -> mlflow.pyfunc.PyFuncModel:
    """The pyfunc of ``source``: the same object ``mlflow.pyfunc.load_model`` gives every other consumer.

    Raises:
        mlflow.exceptions.MlflowException: no such version, alias or model folder.
        training.model_files.ModelCodeError: the model's logged code was modified.
    """
    return mlflow.pyfunc.load_model(source.uri)
