"""Where a registered version's files live in object storage (the ``storageUri`` KServe's storage initializer
downloads) and the digest of those files, from the manifest recorded at registration."""
from __future__ import annotations

from dataclasses import dataclass

import mlflow

from data.redaction import redact
from training.registry.manifest import tree_digest
from training.registry.versions import model_version, verified_manifest

PROXIED_SCHEME = "mlflow-artifacts:"
"""An MLflow server's proxied artifact location: only that server knows the object storage behind it."""


@dataclass(frozen=True, slots=True)
class VersionArtifacts:
    """A registered version as KServe downloads it."""

    model_name: str
    version: str
    storage_uri: str
    """``s3://...``: the version's MLflow model folder (MLflow 3: ``<experiment>/models/<model_id>/artifacts``)."""
    digest: str
    """:func:`training.registry.manifest.tree_digest` of the version's verified manifest: the digest of the files
    the storage initializer downloads."""


def resolve_version(model_name: str, *, version: str = "", alias: str = "",
                    artifacts_destination: str = "") -> VersionArtifacts:
    """The version (``version`` or ``alias``) of ``model_name``, its concrete ``s3://`` model folder and digest
    (from its manifest, checked against its run's record by :func:`training.registry.versions.verified_manifest`;
    nothing is downloaded).

    A proxied location (``mlflow-artifacts:/path``) becomes ``<artifacts_destination>/path``, as the MLflow server
    maps it.

    Raises:
        data.errors.NotFoundError: no such version or alias.
        training.registry.versions.ForeignModelError: the version has no manifest, or one its run did not record.
        ValueError: the folder is not in object storage (a local or proxied store without
            ``serving.artifacts_destination``): KServe cannot download it.
    """
    client = mlflow.MlflowClient()
    mv = model_version(model_name, version or alias, client=client)
    location = client.get_logged_model(mv.model_id).artifact_location if mv.model_id else \
        client.get_model_version_download_uri(model_name, mv.version)
    storage_uri = object_storage_uri(location, artifacts_destination)
    digest = tree_digest(verified_manifest(model_name, str(mv.version), client=client))
    return VersionArtifacts(model_name=model_name, version=str(mv.version), storage_uri=storage_uri, digest=digest)


def object_storage_uri(location: str, artifacts_destination: str = "") -> str:
    """``location`` as the ``s3://`` URI KServe's storage initializer downloads.

    Raises:
        ValueError: not in object storage, and not a proxied location with ``artifacts_destination`` given.
    """
    if location.startswith(PROXIED_SCHEME) and artifacts_destination:
        path = location.removeprefix(PROXIED_SCHEME).lstrip("/")
        location = f"{artifacts_destination.rstrip('/')}/{path}"
    if not location.startswith("s3://"):
        fix = ("set serving.artifacts_destination to the MLflow server's --artifacts-destination (s3://...)"
               if location.startswith(PROXIED_SCHEME) else
               "register models in an MLflow whose artifact store is S3 (mlflow server --artifacts-destination "
               "s3://... or an experiment artifact location s3://...)")
        raise ValueError(f"the version's artifacts are at {redact(location)}, which KServe's storage initializer "
                         f"cannot download (it needs s3://): {fix}")
    return location

