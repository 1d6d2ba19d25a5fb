"""The ``serving:`` section of ``kfloop.yaml``: where a served model's InferenceService logs, what it requests and
which service account reads its artifacts (the image, UID and pull secrets are the ``cluster:`` section's)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from data.settings import section_from_dict

LOG_MODES = ("all", "request", "response")
"""KServe's logger modes (``LogAll``, ``LogRequest``, ``LogResponse``: pkg/apis/serving/v1beta1/component.go)."""
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


@dataclass(kw_only=True, slots=True)
class ServingSettings:
    """How ``kfloop render-serving`` deploys a registered version on KServe."""

    log_uri: str = ""
    """``s3://bucket/prefix`` the predictor's payload logger writes JSON blobs under (KServe's agent adds
    ``<namespace>/<isvc>/<component>/...``); required by ``render-serving``."""
    log_mode: str = "all"
    """What the logger records: ``all`` (requests and responses), ``request`` or ``response``."""
    log_storage_key: str = "credentials"
    """Key of the S3 credentials in the logger's storage secret (KServe's default, ``LoggerDefaultStorageKey``)."""
    service_account: str = "kfloop-serving"
    """Service account of the predictor pod: its secret holds the S3 credentials the storage initializer and the
    logger use (never the manifest)."""
    namespace: str = ""
    """Namespace of the InferenceService and its ServingRuntime; empty: the one ``kubectl apply`` targets."""
    artifacts_destination: str = ""
    """The MLflow server's ``--artifacts-destination`` (e.g. ``s3://bucket/mlartifacts``), which turns a
    proxied ``mlflow-artifacts:/...`` location into the object-storage URI KServe downloads; empty: versions must
    already live at an ``s3://`` location."""
    cpu: str = "1"
    """CPU request and limit of the predictor container."""
    memory: str = "2Gi"
    """Memory request and limit of the predictor container."""
    istio_sidecar: bool = True
    """``sidecar.istio.io/inject`` of the predictor pod: true in a Kubeflow profile, whose mesh (mTLS) carries the
    requests; a serving pod never completes, so the training pods' reason to opt out does not apply."""
    rollout: bool = False
    """Roll each new champion out on KServe right after the training pipeline promotes it (its ``rollout`` step):
    a canary at ``canary_percent``, smoke-tested with the holdout's first rows, then given all the traffic, or
    rolled back (traffic and ``champion``)."""
    canary_percent: int = 10
    """Share of the requests (1-99) the new champion's canary answers while the rollout checks it."""
    rollout_timeout_seconds: float = 600.0
    """How long the rollout waits for the canary to become Ready before it rolls back."""

    def __post_init__(self) -> None:
        if self.log_uri and not self.log_uri.startswith("s3://"):
            raise ValueError(f"serving.log_uri={self.log_uri!r}: use an s3:// prefix, e.g. "
                             "s3://kfloop-logs/inference")
        if self.log_mode not in LOG_MODES:
            raise ValueError(f"serving.log_mode={self.log_mode!r}: use one of {list(LOG_MODES)}")
        if self.artifacts_destination and not self.artifacts_destination.startswith("s3://"):
            raise ValueError(f"serving.artifacts_destination={self.artifacts_destination!r}: use the s3:// URI "
                             "the MLflow server was started with (--artifacts-destination)")
        for name in ("cpu", "memory"):
            if not _QUANTITY.match(str(getattr(self, name))):
                raise ValueError(f"serving.{name}={getattr(self, name)!r}: use a Kubernetes quantity such as "
                                 + ("'1' or '500m'" if name == "cpu" else "'2Gi'"))
        if not 0 < self.canary_percent < 100:
            raise ValueError(f"serving.canary_percent={self.canary_percent!r}: use a share of the traffic from 1 "
                             "to 99")
        if not self.rollout_timeout_seconds > 0:
            raise ValueError(f"serving.rollout_timeout_seconds={self.rollout_timeout_seconds!r}: use a positive "
                             "number of seconds")
        for name in ("log_storage_key", "service_account"):
            if not getattr(self, name):
                raise ValueError(f"serving.{name} is empty: name the {name.replace('_', ' ')}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ServingSettings":
        """Build from the ``serving:`` section of ``kfloop.yaml``.

        Raises:
            ValueError: an unknown key (the message lists the valid ones) or an invalid value.
        """
        return section_from_dict(cls, d, "serving")
