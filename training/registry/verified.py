"""The one way kfloop serves a registered version: :func:`load_verified`, an MLflow pyfunc model loaded from a local
copy whose every file was checked against the manifest recorded at registration before MLflow imported any of it.
"""
from __future__ import annotations

import tempfile

import mlflow

from training.registry.versions import download_verified, model_version, registry_client


def load_verified(model_name: str, ref: str, *, client: "mlflow.MlflowClient | None" = None
                  ) -> "mlflow.pyfunc.PyFuncModel":
    """Version ``ref`` (a version number, or an alias such as ``champion``) of ``model_name`` as an MLflow pyfunc
    model: every file of its logged model is downloaded and verified (:func:`training.registry.versions.
    download_verified`: no file changed, missing or added, MLmodel and pyfunc module included), and only then does
    ``mlflow.pyfunc.load_model`` load that verified local copy.

    Raises:
        training.registry.manifest.TamperedModelError: a file differs from the registered manifest (the message
            names it with both hashes); no code of the model ran.
        training.registry.versions.ForeignModelError: the version has no manifest, a manifest its run did not
            record, or an MLmodel pointing at other code.
        data.errors.NotFoundError: no such version or alias.
    """
    client = registry_client(client)
    version = model_version(model_name, ref, client=client).version
    with tempfile.TemporaryDirectory() as tmp:
        local = download_verified(model_name, str(version), tmp, client=client)
        return mlflow.pyfunc.load_model(str(local))
