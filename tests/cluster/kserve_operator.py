"""Operator mode of the Kubernetes API test server (tests/cluster/k8s_server.py) for InferenceServices
(``serving.kserve.io/v1beta1``) in Knative mode: KServe v0.20.0's InferenceService controller, the parts of Knative
Serving it relies on (revisions, the route's traffic split) and the payload-logging agent, each predictor pod a local
process group run by the kubelet of tests/cluster/k8s_operator.py, really running the ServingRuntime's container.

Written from kserve at tag v0.20.0 and cited by file and function, never from kfloop's code:

* admission: ``pkg/apis/serving/v1beta1/inference_service_validation.go`` through tests/cluster/kserve_validation.py
  (``ValidateCreate`` / ``ValidateUpdate``: the webhook ``inferenceservice.kserve-webhook-server.validator``).
* the deployment mode: ``controller.go`` ``Reconcile`` (:156) resolves it by ``utils/utils.go`` ``GetDeploymentMode``
  (:224-248: ``status.deploymentMode`` parsed, else the annotation ``serving.kserve.io/deploymentMode`` if it names
  ``Standard``, ``Knative`` or ``ModelMesh`` after the legacy names, else the default ``Knative``: the
  ``deploy`` config's ``Serverless`` in config/configmap/inferenceservice.yaml :745 as ``NewDeployConfig``,
  configmap.go :377-380, converts it) and ``updateStatus`` (:424-425) records it as ``status.deploymentMode``.
* ``pkg/controller/v1beta1/inferenceservice/components/predictor.go``: ``reconcileModel`` (the ServingRuntime named
  by ``model.runtime`` in the namespace, else ``RuntimeNotRecognized``; the protocol version it must support),
  ``buildPodSpec`` (``MergeServingRuntimeAndInferenceServiceSpecs``: the runtime's first container as
  ``kserve-container`` with the model's resources; ``ReplacePlaceholders``: ``{{.Name}}`` is the InferenceService's
  name), ``buildObjectMeta`` (labels and annotations of runtime < isvc < predictor, plus
  ``serving.kserve.io/inferenceservice`` and ``component: predictor``), ``PredictorServiceName`` (``<isvc>-predictor``).
* ``components/component.go`` ``addLoggerAnnotations``: the logger's ``internal.serving.kserve.io/logger*`` pod
  annotations (so a logger change is a new revision).
* ``reconcilers/knative/ksvc_reconciler.go`` ``createKnativeService``: traffic targets. With ``canaryTrafficPercent``
  and a rolled-out revision: the latest revision at P percent (tag ``latest`` under
  ``serving.kserve.io/enable-tag-routing`` among the predictor's annotations of runtime, isvc and predictor) and,
  under 100, the last rolled-out revision at 100 - P (tag ``prev``); otherwise the latest at 100. The storage
  initializer is added there (``pod.CommonStorageInitialization``).
* ``pkg/webhook/admission/pod/storage_initializer_injector.go`` ``CommonStorageInitialization`` (one URI):
  ``pvc://<claim>/<path>`` mounts the claim at ``/mnt/models`` with ``subPath`` (volume ``kserve-pvc-source``), no
  init container; any other URI gets the ``storage-initializer`` init container with args ``<uri> /mnt/models`` and
  the emptyDir ``kserve-provision-location`` mounted in both containers; credentials from the service account
  (``pkg/credentials/service_account_credentials.go`` ``CreateSecretVolumeAndEnv``: its ``secrets``, the first with
  ``AWS_SECRET_ACCESS_KEY``; ``pkg/credentials/s3/s3_secret.go`` ``BuildSecretEnvs`` and ``s3/utils.go``
  ``BuildS3EnvVars``: the keys by ``secretKeyRef``, ``S3_ENDPOINT`` / ``AWS_ENDPOINT_URL`` / ``S3_USE_HTTPS`` /
  ``AWS_DEFAULT_REGION`` from the Secret's ``serving.kserve.io/s3-*`` annotations).
* ``pkg/apis/serving/v1beta1/inference_service_status.go`` ``PropagateStatus`` (latest created / ready / rolled-out
  and previous rolled-out revisions, traffic, url, the ``PredictorReady``, ``PredictorRouteReady`` and
  ``PredictorConfigurationReady`` conditions), ``PropagateCrossComponentStatus`` (``RoutesReady`` and
  ``LatestDeploymentReady`` of the predictor's, as ``controller.go`` ``Reconcile`` sets them in Knative mode) and
  ``conditionSet`` (``Ready`` of ``PredictorReady`` and ``IngressReady``, kept by knative.dev/pkg's
  ``apis/condition_set.go``: see :class:`Status`); ``controller.go`` ``Reconcile`` (the conditions initialized
  :224-228, ``Stopped`` False :309-317, no ``serving.kserve.io/stop`` being emulated) and ``updateStatus`` (written
  only when something but a ``lastTransitionTime`` changed: ``VolatileTime``);
  ``reconcilers/ingress/ingress_reconciler.go`` ``Reconcile`` (``status.url``, ``address``, ``IngressReady``).
* the agent (``pkg/webhook/admission/pod/agent_injector.go`` ``InjectAgent``: ``--log-url``, ``--log-mode``,
  ``--source-uri`` the pod's name, ``--endpoint`` / ``--component`` from the pod's labels, ``--log-store-path``,
  ``--log-store-format``, ``--metadata-annotations`` from the pod's annotations; credentials of the pod's service
  account, then of ``logger.storage.serviceAccountName``, default ``logger-sa``) and ``pkg/logger``:
  ``handler.go`` ``ServeHTTP`` (the id from ``Ce-Id`` or a new UUID, the request logged before it is passed on, the
  response only after an HTTP 200, both with the request's content type), ``worker.go`` ``sendHttpCloudEvent``
  (binary CloudEvent: ``ce-id``, ``ce-type``, ``ce-source``, ``ce-time``, extensions ``recordedtime``,
  ``inferenceservicename``, ``namespace``, ``component``, ``endpoint``, ``metadata``, ``annotations``),
  ``store.go`` ``BlobStore.Store`` / ``getObjectKey`` / ``parseBlobStoreURL`` (key
  ``<prefix>/<namespace>/<isvc>/<component>/<path>/<id>-<request|response>.json``), ``marshaller_json.go`` (one
  record an object) of ``types.go`` ``LogRequest`` as Go's ``encoding/json`` writes it.

Knative Serving (v1.x, which KServe's Knative mode runs on): each change of the service's template is a new revision
``<ksvc>-0000N`` (``kmeta.ChildName(config, "-%05d")`` of the configuration's generation); a traffic-only change
makes none; each change of the service's spec (template or traffic, which ``createKnativeService`` derives from
``latestRolledoutRevision`` too) is a new generation of the service, observed at once; ``latestRevision`` targets
follow the latest *ready* revision, so a failing new revision leaves the traffic on the old one;
``latestReadyRevisionName`` only moves forward; a revision is ready once its container answers the queue-proxy's
default TCP probe on its port and failed once that container terminated with an error (``ContainerHealthy`` False,
the log's tail as message: ``terminationMessagePolicy: FallbackToLogsOnError``); a revision no route sends traffic to
scales to zero (its pod is deleted) unless it is the latest created.

Deliberate differences, forced by every pod sharing this host's network:

* The route is a small HTTP proxy per InferenceService on loopback (and one per traffic tag): ``status.url`` and
  ``components.predictor.url`` are ``http://127.0.0.1:<port>`` (KServe: ``http://<isvc>.<ns>.<domain>``), and a tag's
  url is its own port. It picks a revision for each request by the traffic percentages deterministically: request
  ``n`` goes to the target whose share of ``[0, 100)`` holds ``37 n mod 100``, so every 100 consecutive requests
  are split exactly by the percentages (Knative's split is random per request). ``routed`` counts them by revision.
* The agent is played by that proxy (no ``agent`` or ``queue-proxy`` container); a record is stored before the
  answer returns (the agent's work queue delivers it soon after).
* The runtime container's HTTP port (its ``containerPort``; KServe's 8080) and KServe's gRPC port 8081, where they
  appear in its args, become free host ports of the revision; ``PORT`` is set to the HTTP one, as Knative sets it.
* The ``storage-initializer`` runs tests/cluster/kserve_storage_initializer.py (the image's entrypoint, see there):
  a local process on the process kubelet; on the Docker kubelet a container of the image
  :data:`INITIALIZER_IMAGE`, which :func:`build_storage_initializer` makes from the image under test.

Refused with the field's name, as not emulated (``PredictorReady`` False, reason ``NotEmulated``): a deployment
mode other than ``Knative``, other implementations than ``model``, ``storageUri`` schemes other than ``s3://`` and
``pvc://``, ``storage``, ``storageUris``, transformers and explainers, a logger ``batchSize`` over 1 or
``marshallerUrl``, a blob format other than ``json``, the stop annotation (``serving.kserve.io/stop: "true"``);
``minReplicas``/``maxReplicas``/autoscaling are ignored (one pod per running revision).
"""
from __future__ import annotations

import base64
import copy
import http.client
import io
import itertools
import json
import re
import socket
import sys
import tarfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import boto3

from cluster import kserve_validation
from cluster.k8s_operator import _JobController, ProcessRuntime
from cluster.k8s_store import (INFERENCESERVICES, PODS, SECRETS, SERVICE_ACCOUNTS, SERVINGRUNTIMES, ApiError,
                               now)
from cluster.k8s_validation import webhook_denied
from cluster.kuberay_operator import rand5
from cluster.server_process import free_port

if TYPE_CHECKING:
    from cluster.k8s_server import K8sServer

WEBHOOK = "inferenceservice.kserve-webhook-server.validator"
ISVC_LABEL, COMPONENT_LABEL, ENDPOINT_LABEL = "serving.kserve.io/inferenceservice", "component", "endpoint"
"""``InferenceServicePodLabelKey``, ``KServiceComponentLabel``, ``KServiceEndpointLabel`` (pkg/constants)."""
SERVICE_LABEL, CONFIGURATION_LABEL, REVISION_LABEL = (
    "serving.knative.dev/service", "serving.knative.dev/configuration", "serving.knative.dev/revision")
INTERNAL = "internal.serving.kserve.io"
"""``InferenceServiceInternalAnnotationsPrefix``: the logger's pod annotations (``addLoggerAnnotations``)."""
TAG_ROUTING = "serving.kserve.io/enable-tag-routing"
"""``EnableRoutingTagAnnotationKey``."""
STOP_ANNOTATION = "serving.kserve.io/stop"
"""``StopAnnotationKey`` (pkg/constants/constants.go:121): ``true`` in any case stops the InferenceService
(pkg/utils/utils.go ``GetForceStopRuntime``, l. 347-349)."""
CROSS_COMPONENT = {
    "RoutesReady": {"predictor": "PredictorRouteReady", "transformer": "TransformerRouteReady",
                    "explainer": "ExplainerRoutesReady"},
    "LatestDeploymentReady": {"predictor": "PredictorConfigurationReady",
                              "transformer": "TransformerConfigurationReady",
                              "explainer": "ExplainerConfigurationReady"}}
"""``conditionsMapIndex`` (inference_service_status.go :277-292): the components' condition each aggregates."""
DEFAULT_MODE = kserve_validation.KNATIVE
"""``DeployConfig.DefaultDeploymentMode`` as installed (see the module docstring)."""
RESOLVED_MODES = (kserve_validation.STANDARD, kserve_validation.KNATIVE, "ModelMesh")
"""The modes an annotation may choose (``GetDeploymentMode``, utils.go :240-242)."""
HAPPY, DEPENDENTS = "Ready", ("PredictorReady", "IngressReady")
"""``conditionSet`` (inference_service_status.go :295-298): ``NewLivingConditionSet(PredictorReady, IngressReady)``."""
CONTAINER, INITIALIZER = "kserve-container", "storage-initializer"
INITIALIZER_IMAGE = "kserve/storage-initializer:v0.20.0"
INITIALIZER_ENTRYPOINT = "/storage-initializer/scripts/initializer-entrypoint"
"""The image's entrypoint (python/storage-initializer.Dockerfile)."""
INITIALIZER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]}}
"""The default ClusterStorageContainer's ``securityContext`` as the chart installs it (charts/_common/common-patches/
storagecontainer-patch.yaml of charts/kserve-resources/values.yaml ``kserve.storage.containerSecurityContext``),
which Pod Security ``restricted`` admits beside the pod's ``seccompProfile``."""
MODEL_MOUNT, PROVISION_VOLUME, PVC_VOLUME = "/mnt/models", "kserve-provision-location", "kserve-pvc-source"
"""``DefaultModelLocalMountPath``, ``StorageInitializerVolumeName``, ``PvcSourceMountName``."""
GRPC_PORT = 8081
"""KServe's model servers' gRPC port (``kserve.constants.DEFAULT_GRPC_PORT``), opened beside the HTTP one."""
LOGGER_SERVICE_ACCOUNT = "logger-sa"
"""``LoggerDefaultServiceAccountName``."""
REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_ANNOTATIONS = {"serving.kserve.io/s3-region": "AWS_DEFAULT_REGION",
                  "serving.kserve.io/s3-verifyssl": "S3_VERIFY_SSL"}
S3_ENDPOINT_ANNOTATION, S3_HTTPS_ANNOTATION = "serving.kserve.io/s3-endpoint", "serving.kserve.io/s3-usehttps"
REQUEUE_SECONDS = 0.25
"""The longest the controller waits between reconciles when nothing in the store changes (it also probes)."""
SPLIT_STRIDE = 37
"""Coprime to 100: request ``n`` lands at ``37 n mod 100``, a permutation of each 100 consecutive requests."""
LOG_TAIL_LINES = 20


def admit(isvc: dict, old: dict | None = None) -> None:
    """KServe's validating webhook on create, and on update from ``old`` (the stored object, its status included).

    Raises:
        ApiError: 403 with the webhook's denial, as the API server answers it.
    """
    refusal = kserve_validation.validate(isvc) if old is None else kserve_validation.validate_update(isvc, old)
    if refusal:
        raise ApiError(403, "Forbidden", webhook_denied(WEBHOOK, refusal))


def create(api: K8sServer, namespace: str, body: dict) -> dict:
    """Admit and store an InferenceService; in operator mode start its controller."""
    admit(body)
    obj = api.store.create(INFERENCESERVICES, namespace, body)
    if api.operator:
        api.start_controller(INFERENCESERVICES, namespace, InferenceServiceController(api, namespace, obj))
    return obj


def deleted(api: K8sServer, namespace: str, name: str) -> None:
    """The InferenceService is gone: stop its controller and routes, delete its pods (owner references)."""
    api.stop_controller(INFERENCESERVICES, namespace, name)
    for pod in api.store.list(PODS, namespace, f"{ISVC_LABEL}={name}")[0]:
        api.delete_pod(namespace, pod["metadata"]["name"])


def deployment_mode(isvc: dict) -> str:
    """``GetDeploymentMode`` with the installed default (see the module docstring)."""
    recorded = (isvc.get("status") or {}).get("deploymentMode", "")
    if recorded:
        return kserve_validation.parse_deployment_mode(recorded)
    annotated = (isvc["metadata"].get("annotations") or {}).get(kserve_validation.DEPLOYMENT_MODE, "")
    annotated = kserve_validation.LEGACY_MODES.get(annotated, annotated)
    return annotated if annotated in RESOLVED_MODES else DEFAULT_MODE


class NotEmulated(ValueError):
    """A field the emulation does not model (its path in the message)."""


@dataclass
class Revision:
    """One Knative revision of the predictor and its (at most one) pod."""

    name: str
    template: dict
    """``{"metadata": ..., "spec": ...}``: the pod template it was made from (what makes a new revision)."""
    logger: dict | None
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    pod: str = ""
    ready: bool = False
    failure: str = ""


@dataclass
class Target:
    """A resolved traffic target (Knative ``TrafficTarget`` in the service's status)."""

    revision: str
    percent: int
    latest: bool
    tag: str = ""


class Status:
    """An InferenceService's status (its JSON, ``json``) in one reconcile, with its conditions kept as
    knative.dev/pkg's ``conditionsImpl`` (``apis/condition_set.go`` at 4a022ed9999a, the version kserve v0.20.0's
    go.mod pins) keeps those of ``conditionSet``: ``Ready`` and its terminal dependents carry no ``severity``, the
    others ``Info`` (``severity`` :220-225); a condition set again keeps its ``lastTransitionTime`` only when nothing
    else changed (``SetCondition`` :187-209). Go orders conditions set within one reconcile by nanoseconds, which
    JSON's seconds lose: ``fresh`` keeps that order. ``dependents``: those of ``Ready``'s living set."""

    def __init__(self, status: dict, dependents: tuple[str, ...] = DEPENDENTS):
        self.json, self.dependents = copy.deepcopy(status), dependents
        self.fresh: list[str] = []

    def condition(self, kind: str) -> dict | None:
        return next((c for c in self.json.get("conditions") or [] if c["type"] == kind), None)

    def state(self, kind: str) -> str:
        """The condition's status, Unknown when unset (``IsConditionUnknown``, inference_service_status.go
        :329-332)."""
        return (self.condition(kind) or {}).get("status", "Unknown")

    def initialize(self) -> None:
        """``InitializeConditions`` (:416-436): unset ones Unknown (True under a True ``Ready``)."""
        happy = self.condition(HAPPY) or self._set(HAPPY, "Unknown")
        for kind in self.dependents:
            if self.condition(kind) is None:
                self._set(kind, "True" if happy["status"] == "True" else "Unknown")

    def set(self, kind: str, state: str, reason: str = "", message: str = "") -> None:
        """``SetCondition`` (inference_service_status.go :638-648): ``MarkUnknown``, ``MarkTrueWithReason`` or
        ``MarkFalse`` by ``state``."""
        {"Unknown": self._mark_unknown, "True": self._mark_true, "False": self._mark_false}[state](kind, reason,
                                                                                                 message)

    def _mark_true(self, kind: str, reason: str, message: str) -> None:
        """``MarkTrueWithReason`` (:270-280) and ``recomputeHappiness`` (:283-301)."""
        self._set(kind, "True", reason, message)
        unhappy = self._unhappy_dependent()
        if unhappy:
            self._set(HAPPY, unhappy["status"], unhappy.get("reason", ""), unhappy.get("message", ""))
        elif kind != HAPPY:
            self._set(HAPPY, "True")

    def _mark_unknown(self, kind: str, reason: str, message: str) -> None:
        """``MarkUnknown`` (:354-392): a False dependent makes ``Ready`` False with this reason instead."""
        self._set(kind, "Unknown", reason, message)
        if any(self.state(dependent) == "False" for dependent in self.dependents):
            if self.state(HAPPY) != "False":
                self._mark_false(HAPPY, reason, message)
        elif kind in self.dependents:
            self._set(HAPPY, "Unknown", reason, message)

    def _mark_false(self, kind: str, reason: str, message: str) -> None:
        """``MarkFalse`` (:395-412): a dependent's ``Ready`` with it."""
        for t in (kind, HAPPY) if kind in self.dependents else (kind,):
            self._set(t, "False", reason, message)

    def _unhappy_dependent(self) -> dict | None:
        """``findUnhappyDependent`` (:303-350): of the terminal conditions, most recently changed first, a False one,
        else an Unknown one, else Unknown while one is unset."""
        terminal = [c for c in self.json.get("conditions") or [] if not c.get("severity") and c["type"] != HAPPY]
        terminal.sort(key=lambda c: (c.get("lastTransitionTime", ""),
                                     self.fresh.index(c["type"]) + 1 if c["type"] in self.fresh else 0),
                      reverse=True)
        for state in ("False", "Unknown"):
            unhappy = next((c for c in terminal if c["status"] == state), None)
            if unhappy:
                return unhappy
        return {"status": "Unknown"} if len(self.dependents) > len(terminal) else None

    def _set(self, kind: str, state: str, reason: str = "", message: str = "") -> dict:
        """``conditionsImpl.SetCondition`` (:187-209) of a condition as Go writes it (``omitempty``)."""
        severity = "" if kind == HAPPY or kind in self.dependents else "Info"
        new = {k: v for k, v in (("type", kind), ("status", state), ("severity", severity), ("reason", reason),
                                 ("message", message)) if v}
        old = self.condition(kind)
        if old is not None and {k: v for k, v in old.items() if k != "lastTransitionTime"} == new:
            return old
        new["lastTransitionTime"] = now()
        self.json["conditions"] = sorted([*(c for c in self.json.get("conditions") or [] if c["type"] != kind), new],
                                         key=lambda c: c["type"])
        self.fresh = [*(t for t in self.fresh if t != kind), kind]
        return new


class InferenceServiceController(_JobController):
    """The reconcile loop of one InferenceService (KServe's predictor and ingress reconcilers over Knative's
    configuration and route), the kubelet of its pods, and its routes."""

    def __init__(self, api: K8sServer, namespace: str, isvc: dict):
        self._setup(api, namespace, isvc)
        self._write_pod_files([])
        self.run_policy: dict = {}
        self.ksvc = f"{self.name}-predictor"
        self.revisions: list[Revision] = []
        self.latest_ready = ""
        self.service_spec: tuple[dict, list[Target]] | None = None
        self.service_generation = 0
        """The Knative Service's spec (template, traffic) and ``metadata.generation``, one more each spec change."""
        self.targets: list[Target] = []
        self.routes: dict[str, Route] = {}
        self.routed: dict[str, int] = {}
        """Requests each revision answered through the routes (a test helper)."""
        self.traffic_history: list[list[tuple[str, int, str]]] = []
        """Each traffic split the route took, in order: ``(revision, percent, tag)`` per target (a test helper)."""
        self._thread = threading.Thread(target=self._loop, name=f"isvc-{self.name}", daemon=True)

    def start(self) -> None:
        self.routes[""] = Route(self, "")
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for route in list(self.routes.values()):
            route.close()

    # -- the loop

    def _loop(self) -> None:
        store, revision = self.api.store, -1
        while not self.stopping.is_set():
            try:
                self.reconcile()
            except ApiError:
                return  # the InferenceService is gone
            with store.lock:
                if store.revision == revision and not store.closed:
                    store.lock.wait(REQUEUE_SECONDS)
                if store.closed:
                    return
                revision = store.revision

    def reconcile(self) -> None:
        isvc = self.api.store.get(INFERENCESERVICES, self.namespace, self.name)
        status = Status(isvc.get("status") or {})
        if status.condition(HAPPY) is None:  # controller.go Reconcile :224-228
            status.initialize()
        status.json["deploymentMode"] = mode = deployment_mode(isvc)  # updateStatus (controller.go :424-425)
        try:
            if mode != kserve_validation.KNATIVE:
                raise NotEmulated(f"metadata.annotations[{kserve_validation.DEPLOYMENT_MODE!r}]: deployment mode "
                                  f"{mode} is not emulated by the test cluster's KServe")
            template, logger = self._template(isvc)
        except NotEmulated as exc:
            status.set("PredictorReady", "False", "NotEmulated", str(exc))
            return self._write_status(isvc, status)
        except LookupError as exc:  # predictor.go reconcileModel
            status.json["modelStatus"] = {"transitionStatus": "InvalidSpec",
                                          "lastFailureInfo": {"reason": "RuntimeNotRecognized", "message": str(exc)}}
            return self._write_status(isvc, status)
        if not self.revisions or self.revisions[-1].template != template:
            self.revisions.append(Revision(f"{self.ksvc}-{len(self.revisions) + 1:05d}", template, logger))
        latest = self.revisions[-1]
        predictor = isvc["spec"]["predictor"]
        rolled_out = (status.json.get("components", {}).get("predictor") or {}).get("latestRolledoutRevision", "")
        spec = (template, ksvc_traffic(predictor.get("canaryTrafficPercent"), rolled_out,
                                       template["metadata"]["annotations"]))
        if spec != self.service_spec:
            self.service_spec, self.service_generation = spec, self.service_generation + 1
        self._scale(latest, rolled_out, predictor)
        self._probe()
        if latest.ready:
            self.latest_ready = latest.name
        self.targets = route_traffic(spec[1], self.latest_ready)
        self._sync_routes()
        split = [(t.revision, t.percent, t.tag) for t in self.targets]
        if split and (not self.traffic_history or self.traffic_history[-1] != split):
            self.traffic_history.append(split)
        propagate_status(status, self._service_status(latest))
        if status.condition("Stopped") is None:  # controller.go Reconcile :309-317
            status.set("Stopped", "False")
        for kind in CROSS_COMPONENT:  # controller.go Reconcile :340-353, Knative mode
            propagate_cross_component_status(status, ["predictor"], kind)
        ingress(status, self.name, self.namespace)
        self._write_status(isvc, status)

    # -- predictor.go: the pod template of the desired revision

    def _template(self, isvc: dict) -> tuple[dict, dict | None]:
        spec, meta = isvc["spec"], isvc["metadata"]
        if (meta.get("annotations") or {}).get(STOP_ANNOTATION, "").lower() == "true":  # utils.go GetForceStopRuntime
            raise NotEmulated(f"metadata.annotations[{STOP_ANNOTATION!r}]: stopping is not emulated by the test "
                              "cluster's KServe")
        for component in ("transformer", "explainer"):
            if spec.get(component):
                raise NotEmulated(f"spec.{component} is not emulated by the test cluster's KServe")
        predictor = spec["predictor"]
        others = [k for k in kserve_validation.implementations(predictor) if k != "model"]
        if others or "model" not in predictor:
            raise NotEmulated(f"spec.predictor.{(others or ['model'])[0]}: only spec.predictor.model with a runtime is "
                              "emulated by the test cluster's KServe")
        model = predictor["model"]
        for key in ("storage", "storageUris"):
            if key in model or key in predictor:
                raise NotEmulated(f"spec.predictor.model.{key} is not emulated by the test cluster's KServe")
        uri = model.get("storageUri", "")
        if not uri.startswith(("s3://", "pvc://")):
            raise NotEmulated(f"spec.predictor.model.storageUri={uri!r}: only s3:// and pvc:// are emulated by the "
                              "test cluster's KServe")
        runtime = self._runtime(model)
        container = copy.deepcopy(runtime["containers"][0])
        container["name"] = CONTAINER
        for key, value in model.items():  # MergeServingRuntimeAndInferenceServiceSpecs: the isvc's container wins
            if key not in ("modelFormat", "runtime", "protocolVersion", "storageUri"):
                container[key] = copy.deepcopy(value)
        container["args"] = [a.replace("{{.Name}}", meta["name"]) for a in container.get("args", [])]
        container["command"] = [a.replace("{{.Name}}", meta["name"]) for a in container.get("command", [])]
        pod_spec: dict[str, Any] = {k: copy.deepcopy(v) for k, v in runtime.items()
                                    if k not in ("containers", "supportedModelFormats", "protocolVersions",
                                                 "multiModel", "disabled", "builtInAdapter", "grpcDataEndpoint",
                                                 "grpcEndpoint", "httpDataEndpoint", "replicas", "storageHelper",
                                                 "annotations", "labels", "nodeSelector", "affinity", "tolerations")}
        for key in ("serviceAccountName", "securityContext", "imagePullSecrets", "volumes"):
            if key in predictor:
                pod_spec[key] = copy.deepcopy(predictor[key])
        pod_spec["containers"] = [container]
        _storage_initialization(self.api, self.namespace, uri, pod_spec)
        logger = self._logger(predictor.get("logger"))
        annotations = {**(runtime.get("annotations") or {}), **(meta.get("annotations") or {}),
                       **(predictor.get("annotations") or {})}
        if logger:  # component.go addLoggerAnnotations: a logger change is a template change, so a new revision
            annotations.update({f"{INTERNAL}/logger": "true", f"{INTERNAL}/logger-mode": logger["mode"],
                                **({f"{INTERNAL}/logger-sink-url": logger["url"]} if logger["url"] else {}),
                                **({f"{INTERNAL}/logger-metadata-headers": ",".join(logger["headers"])}
                                   if logger["headers"] else {}),
                                **({f"{INTERNAL}/logger-metadata-annotations": ",".join(logger["annotations"])}
                                   if logger["annotations"] else {})})
        labels = {**(runtime.get("labels") or {}), **(meta.get("labels") or {}), **(predictor.get("labels") or {}),
                  ISVC_LABEL: meta["name"], COMPONENT_LABEL: "predictor"}
        return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}, logger

    def _runtime(self, model: dict) -> dict:
        name = model.get("runtime", "")
        try:
            runtime = self.api.store.get(SERVINGRUNTIMES, self.namespace, name)["spec"]
        except ApiError:
            raise LookupError(f"No ServingRuntimes or ClusterServingRuntimes with the name: {name}") from None
        version = model.get("protocolVersion")
        if version and version not in runtime.get("protocolVersions", ["v1"]):
            raise LookupError(f"specified runtime {name} does not support specified protocol version")
        return runtime

    def _logger(self, spec: dict | None) -> dict | None:
        if not spec:
            return None
        for key in ("marshallerUrl", "batchInterval"):
            if key in spec:
                raise NotEmulated(f"spec.predictor.logger.{key} is not emulated by the test cluster's KServe")
        if int(spec.get("batchSize", 1)) > 1:
            raise NotEmulated("spec.predictor.logger.batchSize over 1 is not emulated by the test cluster's KServe")
        storage = spec.get("storage") or {}
        fmt = (storage.get("parameters") or {}).get("format", "json")
        if fmt != "json":
            raise NotEmulated(f"spec.predictor.logger.storage.parameters.format={fmt!r}: only json is emulated by "
                              "the test cluster's KServe")
        return {"url": spec.get("url", ""), "mode": spec.get("mode", "all"), "path": storage.get("path", ""),
                "storage_account": storage.get("serviceAccountName") or LOGGER_SERVICE_ACCOUNT if storage else "",
                "annotations": spec.get("metadataAnnotations") or [], "headers": spec.get("metadataHeaders") or []}

    # -- Knative: revisions, their pods and readiness

    def _scale(self, latest: Revision, rolled_out: str, predictor: dict) -> None:
        """Run a pod for the latest revision and each revision the traffic names; delete the others' pods."""
        wanted = {latest.name} | {t.revision for t in self.targets if t.percent > 0}
        if predictor.get("canaryTrafficPercent") is not None and rolled_out:
            wanted.add(rolled_out)
        for revision in self.revisions:
            if revision.name in wanted and not revision.pod and not revision.failure:
                self._start_pod(revision)
            elif revision.name not in wanted and revision.pod:
                self.api.delete_pod(self.namespace, revision.pod)
                revision.pod = ""

    def _start_pod(self, revision: Revision) -> None:
        meta, spec = copy.deepcopy(revision.template["metadata"]), copy.deepcopy(revision.template["spec"])
        name = f"{revision.name}-deployment-{rand5()}{rand5()}-{rand5()}"
        meta["labels"].update({SERVICE_LABEL: self.ksvc, CONFIGURATION_LABEL: self.ksvc, REVISION_LABEL: revision.name,
                               "app": revision.name})
        container = spec["containers"][0]
        http_port = next((p["containerPort"] for p in container.get("ports", [])), 8080)
        ports = {str(http_port): str(revision.port), str(GRPC_PORT): str(revision.grpc_port)}
        container["args"] = [_map_port(a, ports) for a in container.get("args", [])]
        container["env"] = [*container.get("env", []), {"name": "PORT", "value": str(revision.port)},
                            {"name": "K_REVISION", "value": revision.name},
                            {"name": "K_CONFIGURATION", "value": self.ksvc},
                            {"name": "K_SERVICE", "value": self.ksvc}]
        if isinstance(self.api.runtime, ProcessRuntime):
            for init in spec.get("initContainers", []):
                if init["name"] == INITIALIZER:
                    init["command"] = [sys.executable, str(Path(__file__).with_name("kserve_storage_initializer.py"))]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "name": name}, "spec": spec,
               "status": {"phase": "Pending", "conditions": []}}
        try:
            pod = self.api.create_pod(self.namespace, pod)
        except ApiError as exc:
            revision.failure = str(exc)
            return
        revision.pod = name
        threading.Thread(target=self._kubelet, args=(pod, "predictor", 0), name=f"pod-{name}", daemon=True).start()

    def _probe(self) -> None:
        """The queue-proxy's TCP probe of each running revision's container, and failures from its status."""
        for revision in self.revisions:
            if not revision.pod or revision.ready:
                continue
            try:
                pod = self.api.store.get(PODS, self.namespace, revision.pod)
            except ApiError:
                continue
            status = pod.get("status") or {}
            statuses = status.get("containerStatuses") or [{}]
            if status.get("phase") == "Failed" or statuses[0].get("restartCount", 0) > 0:
                revision.failure = revision.failure or self._termination_message(revision.pod, status)
            elif "running" in (statuses[0].get("state") or {}) and _tcp_open(revision.port):
                revision.ready, revision.failure = True, ""
                self._update_pod(revision.pod, lambda p: p["status"].update(conditions=[
                    *p["status"].get("conditions", []), {"type": "Ready", "status": "True",
                                                         "lastTransitionTime": now()}]))

    def _termination_message(self, pod_name: str, status: dict) -> str:
        """Knative's ``RevisionContainerExitingMessage`` of the failed container's termination message: the tail
        of its own log (``FallbackToLogsOnError``), the storage initializer's when the pod failed in it; empty when
        that log is (a container OOM-killed before it wrote anything)."""
        run = self.api._runs.get((self.namespace, pod_name))
        log = (run.log.with_suffix(f".{INITIALIZER}.log") if status.get("reason") == "Init:Error" else run.log
               ) if run else None
        text = log.read_text(errors="replace") if log and log.exists() else ""
        return "Container failed with: " + "\n".join(text.strip().splitlines()[-LOG_TAIL_LINES:])

    def _master_running(self) -> bool:
        return False  # no job conditions: the kubelet's Running hook does not apply

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        """An init container failed: the revision fails (seen by :meth:`_probe`)."""

    # -- ksvc_reconciler.go and Knative's route

    def _sync_routes(self) -> None:
        for tag in {t.tag for t in self.targets if t.tag} - set(self.routes):
            self.routes[tag] = Route(self, tag)

    def pick(self, tag: str) -> Revision | None:
        """The revision the route of ``tag`` ("" the main one) sends its next request to."""
        with self.lock:
            targets = [t for t in self.targets if t.tag == tag] if tag else list(self.targets)
            if tag:
                targets = [Target(t.revision, 100, t.latest, t.tag) for t in targets[:1]]
            route = self.routes.get(tag)
            if not targets or route is None:
                return None
            point = (next(route.counter) * SPLIT_STRIDE) % 100
            for target in targets:
                if point < target.percent:
                    return next(r for r in self.revisions if r.name == target.revision)
                point -= target.percent
            return None

    def activate(self, revision: Revision, timeout: float = 120.0) -> None:
        """Knative's activator: hold a request for a revision scaled to zero until its pod answers again."""
        deadline = time.monotonic() + timeout
        while not _tcp_open(revision.port) and time.monotonic() < deadline and not self.stopping.wait(0.1):
            pass

    def _service_status(self, latest: Revision) -> dict:
        """The Knative Service's status: revisions, traffic, url, conditions, ``observedGeneration`` (its
        generation: knative.dev/pkg ``reconciler/reconcile_common.go`` ``PostProcessReconcile`` :82)."""
        if latest.ready:
            config = ("True", "", "")
        elif latest.failure:
            config = ("False", "RevisionFailed", f'Revision "{latest.name}" failed with message: {latest.failure}.')
        else:
            config = ("Unknown", "RevisionMissing", f'Configuration "{self.ksvc}" is waiting for a Revision to become '
                                                    "ready.")
        routes = ("True", "", "") if self.targets else (
            "False" if latest.failure else "Unknown", "RevisionMissing",
            f'Configuration "{self.ksvc}" does not have any ready Revision.')
        ready = config if config[0] != "True" else routes
        traffic = [{**({"tag": t.tag, "url": self.routes[t.tag].url} if t.tag else {}), "revisionName": t.revision,
                    "latestRevision": t.latest, "percent": t.percent} for t in self.targets]
        conditions = [{"type": kind, "status": state, **({"reason": reason} if reason else {}),
                       **({"message": message} if message else {})}
                      for kind, (state, reason, message) in (("ConfigurationsReady", config), ("Ready", ready),
                                                             ("RoutesReady", routes))]
        return {"observedGeneration": self.service_generation, "latestCreatedRevisionName": latest.name,
                "latestReadyRevisionName": self.latest_ready,
                "traffic": traffic, "url": self.routes[""].url,
                "address": {"url": f"http://{self.ksvc}.{self.namespace}.svc.cluster.local"}, "conditions": conditions}

    def _write_status(self, isvc: dict, status: Status) -> None:
        """``updateStatus`` (controller.go :421-456): written unless semantically equal, which ignores the
        conditions' ``lastTransitionTime`` (knative.dev/pkg ``apis/volatile_time.go`` :47-54)."""
        if _semantic(status.json) == _semantic(isvc.get("status") or {}):
            return
        self.api.store.update(INFERENCESERVICES, self.namespace, self.name,
                              lambda obj: {**obj, "status": status.json})


# ------------------------------------------------------------------------------------------------- helpers


def _storage_initialization(api: K8sServer, namespace: str, uri: str, pod_spec: dict) -> None:
    """``CommonStorageInitialization`` for one URI (see the module docstring)."""
    container = pod_spec["containers"][0]
    mounts = container.setdefault("volumeMounts", [])
    volumes = pod_spec.setdefault("volumes", [])
    if uri.startswith("pvc://"):
        claim, _, path = uri[len("pvc://"):].partition("/")
        volumes.append({"name": PVC_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": False}})
        mounts.append({"name": PVC_VOLUME, "mountPath": MODEL_MOUNT, "subPath": path, "readOnly": False})
        return
    volumes.append({"name": PROVISION_VOLUME, "emptyDir": {}})
    mounts.append({"name": PROVISION_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": False})
    init = {"name": INITIALIZER, "image": INITIALIZER_IMAGE, "args": [uri, MODEL_MOUNT],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "100Mi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError", "securityContext": copy.deepcopy(INITIALIZER_SECURITY),
            "volumeMounts": [{"name": PROVISION_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": False}],
            "env": s3_env(api, namespace, pod_spec.get("serviceAccountName") or "default", by_reference=True)}
    pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), init]


def build_storage_initializer(client: Any, base_image: str) -> str:
    """Build :data:`INITIALIZER_IMAGE` for the Docker kubelet (no registry to pull it from): ``base_image`` (one with
    Python and botocore, e.g. the kfloop image under test) with tests/cluster/kserve_storage_initializer.py as
    :data:`INITIALIZER_ENTRYPOINT`, run as UID 1000 from ``/work`` as kserve's Dockerfile does. Returns the image's
    id."""
    script = Path(__file__).with_name("kserve_storage_initializer.py").read_bytes()
    dockerfile = (f"FROM {base_image}\nCOPY initializer-entrypoint {INITIALIZER_ENTRYPOINT}\nUSER 1000\n"
                  f"WORKDIR /work\nENTRYPOINT [\"python\", \"{INITIALIZER_ENTRYPOINT}\"]\n").encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("initializer-entrypoint", script)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=INITIALIZER_IMAGE, rm=True)
    return image.id


def s3_env(api: K8sServer, namespace: str, service_account: str, *, by_reference: bool) -> list[dict]:
    """The S3 env ``CreateSecretVolumeAndEnv`` gives a container from ``service_account``'s Secrets (none when the
    account or a Secret with ``AWS_SECRET_ACCESS_KEY`` is missing); the keys as ``secretKeyRef``, or as values
    when not ``by_reference`` (what the agent's process ends up with)."""
    try:
        account = api.store.get(SERVICE_ACCOUNTS, namespace, service_account)
    except ApiError:
        return []
    env: list[dict] = []
    for ref in account.get("secrets") or []:
        try:
            secret = api.store.get(SECRETS, namespace, ref["name"])
        except ApiError:
            continue
        data = secret.get("data") or {}
        if "AWS_SECRET_ACCESS_KEY" not in data:
            continue
        for key in S3_SECRET_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": key}}} if by_reference
                       else {"name": key, "value": base64.b64decode(data.get(key, "")).decode()})
        annotations = secret["metadata"].get("annotations") or {}
        endpoint = annotations.get(S3_ENDPOINT_ANNOTATION, "")
        if endpoint:
            https = annotations.get(S3_HTTPS_ANNOTATION, "")
            host = endpoint.split("://", 1)[-1]
            scheme = endpoint.split("://", 1)[0] if "://" in endpoint else "http" if https == "0" else "https"
            env += ([{"name": "S3_USE_HTTPS", "value": https}] if https else []) + [
                {"name": "S3_ENDPOINT", "value": host}, {"name": "AWS_ENDPOINT_URL", "value": f"{scheme}://{host}"}]
        env += [{"name": var, "value": annotations[key]} for key, var in S3_ANNOTATIONS.items() if key in annotations]
    return env


def ksvc_traffic(canary: int | None, rolled_out: str, annotations: dict) -> list[Target]:
    """``createKnativeService``'s ``spec.traffic`` (ksvc_reconciler.go :132-164) for the component's annotations and
    its status's ``latestRolledoutRevision``; a ``latestRevision`` target has no revision name."""
    tag = "latest" if annotations.get(TAG_ROUTING) == "true" else ""
    if canary is None or not rolled_out:
        return [Target("", 100, True, tag)]  # blue-green rollout
    return [Target("", canary, True, tag), *([Target(rolled_out, 100 - canary, False, "prev")] if canary < 100 else [])]


def route_traffic(spec: list[Target], latest_ready: str) -> list[Target]:
    """Knative's route: each ``latestRevision`` target resolved to the latest ready revision; none while there is
    none."""
    return [replace(t, revision=latest_ready) if t.latest else t for t in spec] if latest_ready else []


def propagate_status(status: Status, service: dict) -> None:
    """``PropagateStatus`` (inference_service_status.go :567-636) of the predictor: the Knative Service's status
    ``service`` (its JSON) propagated into ``status``."""
    spec = dict((status.json.get("components") or {}).get("predictor") or {})
    spec["latestCreatedRevision"] = service.get("latestCreatedRevisionName", "")
    ready_name = service.get("latestReadyRevisionName", "")
    revision_traffic: dict[str, int] = {}
    for t in service.get("traffic", []):
        revision_traffic[t["revisionName"]] = revision_traffic.get(t["revisionName"], 0) + t["percent"]
    for t in service.get("traffic", []):
        if t["revisionName"] == ready_name and t.get("latestRevision"):
            if spec.get("latestRolledoutRevision", "") != ready_name:
                if t["percent"] == 100:  # track the last revision that's fully rolled out
                    spec["previousRolledoutRevision"] = spec.get("latestRolledoutRevision", "")
                    spec["latestRolledoutRevision"] = ready_name
            elif ready_name == spec["latestCreatedRevision"] and t["percent"] < 100 \
                    and revision_traffic[ready_name] == 100 and spec.get("previousRolledoutRevision"):
                spec["latestRolledoutRevision"] = spec["previousRolledoutRevision"]  # rolled back
    spec["latestReadyRevision"] = ready_name
    conditions = {c["type"]: c for c in service.get("conditions", [])}
    if conditions.get("Ready", {}).get("status") == "True":
        spec.update({k: service[k] for k in ("address", "url") if k in service})
    spec["traffic"] = service.get("traffic", [])
    for kind, source in (("PredictorReady", "Ready"), ("PredictorRouteReady", "RoutesReady"),
                         ("PredictorConfigurationReady", "ConfigurationsReady")):
        if source in conditions:  # SetCondition: a nil condition is left alone
            c = conditions[source]
            status.set(kind, c["status"], c.get("reason", ""), c.get("message", ""))
    status.json["components"] = {**(status.json.get("components") or {}),
                                 "predictor": {k: v for k, v in spec.items() if v != ""}}
    status.json["observedGeneration"] = service.get("observedGeneration", 0)
    if not status.json["observedGeneration"]:  # omitempty
        del status.json["observedGeneration"]


def propagate_cross_component_status(status: Status, components: list[str], kind: str) -> None:
    """``PropagateCrossComponentStatus`` (inference_service_status.go :546-565): condition ``kind`` True when each
    component's is, else as the last component's that is not (Unknown when unset), with reason ``<it> not ready``;
    nothing for a ``kind`` it does not aggregate."""
    if kind not in CROSS_COMPONENT:
        return
    state, reason = "True", ""
    for component in components:
        condition = CROSS_COMPONENT[kind][component]
        if status.state(condition) != "True":
            state, reason = status.state(condition), f"{condition} not ready"
    status.set(kind, state, reason)


def ingress(status: Status, name: str, namespace: str) -> None:
    """``IngressReconciler.Reconcile`` (ingress_reconciler.go :82-127) with Istio's VirtualService: while
    ``PredictorReady`` is not True, ``IngressReady`` as it with reason ``Predictor ingress not created``
    (``createIngress`` :487-497); then, once the predictor has a url, the service's url and address and
    ``IngressReady`` True (:103-122)."""
    if status.state("PredictorReady") != "True":
        status.set("IngressReady", status.state("PredictorReady"), "Predictor ingress not created")
    url = ((status.json.get("components") or {}).get("predictor") or {}).get("url")
    if url:
        status.json.update(url=url, address={"url": f"http://{name}.{namespace}.svc.cluster.local"})
        status.set("IngressReady", "True")


def _semantic(status: dict) -> dict:
    """``status`` less its conditions' ``lastTransitionTime``."""
    return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                     for c in status.get("conditions") or []]}


def _map_port(arg: str, ports: dict[str, str]) -> str:
    for old, new in ports.items():
        if arg == old:
            return new
        if arg.endswith("=" + old):
            return arg[:-len(old)] + new
    return arg


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _rfc3339(moment: datetime) -> str:
    """Go's ``time.Time`` in JSON (RFC 3339 with nanoseconds, trailing zeros dropped), in UTC."""
    text = moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


def _go_url(text: str) -> dict:
    """A ``*url.URL`` as Go's ``encoding/json`` writes it (its exported fields)."""
    parsed = urlparse(text)
    return {"Scheme": parsed.scheme, "Opaque": "", "User": None, "Host": parsed.netloc, "Path": parsed.path,
            "RawPath": "", "OmitHost": False, "ForceQuery": False, "RawQuery": parsed.query, "Fragment": "",
            "RawFragment": ""}


# -------------------------------------------------------------------------------------- the route and agent


class Route:
    """A loopback HTTP proxy for one route of the InferenceService (the main one, or a traffic tag's)."""

    def __init__(self, controller: InferenceServiceController, tag: str):
        self.controller, self.tag = controller, tag
        self.counter = itertools.count()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _RouteHandler)
        self.server.route = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         name=f"route-{controller.name}-{tag}", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _RouteHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
        pass

    def do_GET(self) -> None:
        self._proxy("GET")

    def do_POST(self) -> None:
        self._proxy("POST")

    def _proxy(self, method: str) -> None:
        route: Route = self.server.route
        controller = route.controller
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        revision = controller.pick(route.tag)
        if revision is None:
            return self._answer(503, b"no ready revision", "text/plain")
        with controller.lock:
            controller.routed[revision.name] = controller.routed.get(revision.name, 0) + 1
        agent = Agent(controller, revision) if revision.logger and method == "POST" else None
        request_id = self.headers.get("Ce-Id") or str(uuid.uuid4())
        content_type = self.headers.get("Content-Type", "")
        metadata = {k: [v] for k, v in self.headers.items() if agent and k in revision.logger["headers"]}
        received = datetime.now(timezone.utc)
        if agent and revision.logger["mode"] in ("all", "request"):
            agent.log(REQUEST_TYPE, request_id, body, content_type, received, metadata)
        controller.activate(revision)
        connection = http.client.HTTPConnection("127.0.0.1", revision.port, timeout=120)
        try:
            connection.request(method, self.path, body=body or None,
                               headers={"Content-Type": content_type} if content_type else {})
            response = connection.getresponse()
            answer, status, answer_type = response.read(), response.status, response.getheader("Content-Type", "")
        except OSError as exc:
            return self._answer(502, f"revision {revision.name}: {exc}".encode(), "text/plain")
        finally:
            connection.close()
        if agent and status == 200 and revision.logger["mode"] in ("all", "response"):
            agent.log(RESPONSE_TYPE, request_id, answer, content_type, datetime.now(timezone.utc), metadata)
        self._answer(status, answer, answer_type)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Agent:
    """The payload logger of one revision's pod: blobs to ``s3://`` or binary CloudEvents to ``http(s)://``."""

    def __init__(self, controller: InferenceServiceController, revision: Revision):
        self.controller, self.revision, self.config = controller, revision, revision.logger
        labels = revision.template["metadata"]["labels"]
        annotations = revision.template["metadata"]["annotations"]
        self.fields = {"inferenceService": labels.get(ISVC_LABEL, ""), "namespace": controller.namespace,
                       "component": labels.get(COMPONENT_LABEL, ""), "endpoint": labels.get(ENDPOINT_LABEL, "")}
        self.annotations = {k: annotations[k] for k in self.config["annotations"] if k in annotations}

    def log(self, kind: str, request_id: str, body: bytes, content_type: str, moment: datetime,
            metadata: dict[str, list[str]]) -> None:
        url = self.config["url"]
        if url.startswith("s3://"):
            self._store(url, kind, request_id, body, content_type, moment, metadata)
        else:
            self._send(url, kind, request_id, body, content_type, moment, metadata)

    def _store(self, url: str, kind: str, request_id: str, body: bytes, content_type: str, moment: datetime,
               metadata: dict[str, list[str]]) -> None:
        record = {"url": _go_url(url), "bytes": base64.b64encode(body).decode(), "contentType": content_type,
                  "reqType": kind, "id": request_id, "sourceUri": _go_url(self.revision.pod),
                  **self.fields, "metadata": metadata, "annotations": self.annotations,
                  "occurrenceTime": _rfc3339(moment)}
        record = {k: v for k, v in record.items() if v or k in ("bytes", "occurrenceTime")}  # omitempty
        parsed = urlparse(url)
        parts = [p for p in (parsed.path.lstrip("/"), self.fields["namespace"], self.fields["inferenceService"],
                             self.fields["component"], self.config["path"]) if p]
        key = "/".join([*parts, f"{request_id}-{kind.rsplit('.', 1)[-1]}.json"])
        self._s3().put_object(Bucket=parsed.netloc, Key=re.sub("/+", "/", key),
                              Body=json.dumps(record, separators=(",", ":")).encode())

    def _s3(self):
        env: dict[str, str] = {}
        api, namespace = self.controller.api, self.controller.namespace
        accounts = [self.revision.template["spec"].get("serviceAccountName") or "default",
                    self.config["storage_account"]]
        for account in filter(None, accounts):  # the storage account's env merged over the pod's
            env.update({e["name"]: e["value"] for e in s3_env(api, namespace, account, by_reference=False)})
        return boto3.client("s3", endpoint_url=env.get("AWS_ENDPOINT_URL"),
                            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
                            region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"))

    def _send(self, url: str, kind: str, request_id: str, body: bytes, content_type: str, moment: datetime,
              metadata: dict[str, list[str]]) -> None:
        headers = {"ce-specversion": "1.0", "ce-id": request_id, "ce-type": kind, "ce-source": self.revision.pod,
                   "ce-time": _rfc3339(moment), "ce-recordedtime": _rfc3339(datetime.now(timezone.utc)),
                   "ce-inferenceservicename": self.fields["inferenceService"],
                   "ce-namespace": self.fields["namespace"], "ce-component": self.fields["component"],
                   "ce-endpoint": self.fields["endpoint"], "ce-metadata": json.dumps(metadata, separators=(",", ":")),
                   "Content-Type": content_type}
        if self.annotations:
            headers["ce-annotations"] = json.dumps(self.annotations, separators=(",", ":"))
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers, method="POST"),
                                   timeout=30).close()
        except OSError:
            pass  # at most once: the agent logs the failure and drops the record
