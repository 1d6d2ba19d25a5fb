"""A new champion rolled out on KServe: its InferenceService (:func:`training.serving.manifests.inference_service`)
applied as a canary at ``serving.canary_percent``, waited for until ``Ready`` with ``latestReadyRevision ==
latestCreatedRevision``, smoke-tested with the holdout's first rows through Open Inference Protocol v2 at the canary's
own route (tag ``latest``), then promoted (``canaryTrafficPercent`` removed: all traffic) or rolled back
(``canaryTrafficPercent: 0``: the traffic back on the last rolled-out revision, and ``champion`` back on the version it
replaced). The outcome is tagged on the version (``rollout``, ``rollout_reason``, ``rollout_at``, ``rollout_revision``);
a rollback of the alias is also a move in the champion history."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pandas as pd
from kubernetes import client as k8s
from kubernetes import watch

from data.errors import EXIT_FAILED, KfloopError
from data.fileio import utc_iso
from data.redaction import redact_text
from data.schema_rules import ON_VIOLATION_PARAM
from data.text import shorten
from training.launch.cluster import ClusterConfig
from training.launch.kube_client import REQUEST_TIMEOUT, own_namespace, watch_timeout
from training.registry.versions import MAX_TAG_CHARS, registry_client, rollback
from training.serving import MODEL_VERSION_ANNOTATION
from training.serving.artifacts import resolve_version
from training.serving.manifests import inference_service, serving_runtime
from training.serving.settings import ServingSettings
from training.serving.table import table_request


GROUP, VERSION = "serving.kserve.io", "v1beta1"
TAG_ROUTING = "serving.kserve.io/enable-tag-routing"
"""KServe's annotation giving each traffic target its own route (``latest``: the canary; ``prev``: the rest)."""
SMOKE_ROWS = 5
"""Holdout rows the canary must answer, in ``error`` mode: a row outside the served schema fails the smoke test."""
WATCH_SECONDS = 10
"""The longest one watch of the InferenceService lasts before the wait checks its deadline again."""
PROMOTED, ROLLED_BACK = "promoted", "rolled_back"


class RolloutFailed(KfloopError, RuntimeError):
    """The canary was rolled back (the message says why and where traffic and ``champion`` went)."""

    exit_code = EXIT_FAILED


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutResult:
    model_name: str
    version: str
    outcome: str
    """:data:`PROMOTED` (a rollback raises :class:`RolloutFailed`; the version's ``rollout`` tag says
    :data:`ROLLED_BACK`)."""
    revision: str
    """The canary's revision (``<isvc>-predictor-0000N``)."""
    reason: str


def rollout(model_name: str, version: str, *, serving: ServingSettings, cluster: ClusterConfig,
            holdout: pd.DataFrame, api: k8s.ApiClient, lock: AbstractContextManager) -> RolloutResult:
    """Roll ``version`` out as a canary, smoke-test it, then promote or roll back (see the module docstring).

    Raises:
        RolloutFailed: the canary failed, did not become ready in ``serving.rollout_timeout_seconds`` or failed its
            smoke test; traffic went back to the last rolled-out revision and ``champion`` to the version it
            replaced (if that rollback failed too, the message says so).
        kubernetes.client.ApiException: the cluster refused the InferenceService or ServingRuntime.
    """
    custom, namespace = k8s.CustomObjectsApi(api), serving.namespace or own_namespace()
    artifacts = resolve_version(model_name, version=version, artifacts_destination=serving.artifacts_destination)
    isvc = inference_service(artifacts, serving, cluster, canary_percent=serving.canary_percent)
    isvc["metadata"]["annotations"][TAG_ROUTING] = "true"
    _apply(custom, namespace, "servingruntimes", serving_runtime(serving, cluster))
    before = _created_before(_apply(custom, namespace, "inferenceservices", isvc), version)
    name, revision = model_name, ""
    try:
        revision, canary_url = _wait_canary(custom, namespace, name, before, serving.rollout_timeout_seconds)
        _smoke_test(canary_url, name, holdout.head(SMOKE_ROWS))
    except RolloutFailed as failure:
        revision = revision or _new_revision(custom, namespace, name, before)
        _set_canary(custom, namespace, name, 0)
        reason = f"rollout of v{version} rolled back: {failure}"
        try:
            moved = rollback(model_name, reason=reason, actor="rollout", lock=lock)
            reason += f"; champion back to v{moved.champion_version}"
        except ValueError as exc:  # no champion it replaced: the alias stays, the error says so
            reason += f"; champion not moved ({exc})"
        _record(model_name, version, ROLLED_BACK, reason, revision)
        raise RolloutFailed(reason) from None
    _set_canary(custom, namespace, name, None)
    _wait(custom, namespace, name, serving.rollout_timeout_seconds, "all traffic on the canary",
          lambda isvc: _predictor(isvc).get("latestRolledoutRevision") == revision)
    reason = f"canary {revision} answered {SMOKE_ROWS} holdout rows; all traffic on it"
    _record(model_name, version, PROMOTED, reason, revision)
    return RolloutResult(model_name=model_name, version=str(version), outcome=PROMOTED, revision=revision,
                         reason=reason)


def serve_champion(model_name: str, version: str, *, serving: ServingSettings, cluster: ClusterConfig,
                   api: k8s.ApiClient) -> str:
    """Give ``version`` all the traffic at once (``kfloop rollback``): its InferenceService without a canary, waited
    for until Ready on its revision; that revision.

    Raises:
        RolloutFailed: it did not become ready in ``serving.rollout_timeout_seconds`` (the message says why).
    """
    custom, namespace = k8s.CustomObjectsApi(api), serving.namespace or own_namespace()
    artifacts = resolve_version(model_name, version=version, artifacts_destination=serving.artifacts_destination)
    _apply(custom, namespace, "servingruntimes", serving_runtime(serving, cluster))
    before = _created_before(_apply(custom, namespace, "inferenceservices",
                                    inference_service(artifacts, serving, cluster)), version)
    revision, _ = _wait_canary(custom, namespace, model_name, before, serving.rollout_timeout_seconds)
    _wait(custom, namespace, model_name, serving.rollout_timeout_seconds, f"all traffic on {revision}",
          lambda isvc: _predictor(isvc).get("latestRolledoutRevision") == revision)
    return revision


def _apply(custom: k8s.CustomObjectsApi, namespace: str, plural: str, body: dict) -> dict:
    """Create ``body``, or merge it into the object of its name (``canaryTrafficPercent`` removed unless given);
    the object as it was before (``{}`` when new)."""
    version = body["apiVersion"].split("/")[1]
    name = body["metadata"]["name"]
    try:
        current = custom.get_namespaced_custom_object(GROUP, version, namespace, plural, name,
                                                      _request_timeout=REQUEST_TIMEOUT)
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
        custom.create_namespaced_custom_object(GROUP, version, namespace, plural, body,
                                               _request_timeout=REQUEST_TIMEOUT)
        return {}
    patch = {"metadata": {k: body["metadata"][k] for k in ("labels", "annotations") if k in body["metadata"]},
             "spec": body["spec"]}
    if plural == "inferenceservices" and "canaryTrafficPercent" not in body["spec"]["predictor"]:
        patch["spec"] = {"predictor": {**body["spec"]["predictor"], "canaryTrafficPercent": None}}
    custom.patch_namespaced_custom_object(GROUP, version, namespace, plural, name, patch,
                                          _request_timeout=REQUEST_TIMEOUT)
    return current


def _created_before(current: dict, version: str) -> str:
    """The revision a new one must differ from: the latest created before the apply, or none when the
    InferenceService already named ``version`` (a step run again: KServe makes no new revision for it)."""
    if ((current.get("metadata") or {}).get("annotations") or {}).get(MODEL_VERSION_ANNOTATION) == str(version):
        return ""
    return _predictor(current).get("latestCreatedRevision", "")


def _new_revision(custom: k8s.CustomObjectsApi, namespace: str, name: str, before: str) -> str:
    """The revision the apply created (not ``before``; failed or not ready), or ``""`` when none was."""
    created = _predictor(_read(custom, namespace, name)).get("latestCreatedRevision", "")
    return created if created != before else ""


def _set_canary(custom: k8s.CustomObjectsApi, namespace: str, name: str, percent: int | None) -> None:
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "inferenceservices", name,
                                          {"spec": {"predictor": {"canaryTrafficPercent": percent}}},
                                          _request_timeout=REQUEST_TIMEOUT)


def _predictor(isvc: dict) -> dict:
    return ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}


def _conditions(isvc: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (isvc.get("status") or {}).get("conditions") or []}


def _wait(custom: k8s.CustomObjectsApi, namespace: str, name: str, timeout: float, what: str,
          done: Callable[[dict], Any]) -> Any:
    """Watch the InferenceService until ``done(isvc)`` is truthy (its value); :class:`RolloutFailed` after
    ``timeout`` seconds. Each watch lasts at most :data:`WATCH_SECONDS`; an expired one (410) re-reads.
    """
    deadline = time.monotonic() + timeout
    isvc = _read(custom, namespace, name)
    while True:
        value = done(isvc)
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            ready = _conditions(isvc).get("Ready", {})
            raise RolloutFailed(f"InferenceService {namespace}/{name}: no {what} within {timeout:g} s (Ready "
                                f"{ready.get('status', 'Unknown')}: {ready.get('message', '')})")
        seconds = max(1, round(min(WATCH_SECONDS, left)))
        try:
            for event in watch.Watch().stream(
                    custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "inferenceservices",
                    field_selector=f"metadata.name={name}", resource_version=isvc["metadata"]["resourceVersion"],
                    timeout_seconds=seconds, _request_timeout=watch_timeout(seconds)):
                if event["type"] == "DELETED":
                    raise RolloutFailed(f"InferenceService {namespace}/{name} was deleted while waiting for {what}")
                isvc = event["object"]
                if done(isvc):
                    break
        except k8s.ApiException as exc:
            if exc.status != 410:
                raise
            isvc = _read(custom, namespace, name)


def _read(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "inferenceservices", name,
                                               _request_timeout=REQUEST_TIMEOUT)


def _wait_canary(custom: k8s.CustomObjectsApi, namespace: str, name: str, before: str,
                 timeout: float) -> tuple[str, str]:
    """The new revision (not ``before``) once Ready and the latest ready one, and its route's URL (the ``latest``
    tag's, else the service's).

    Raises:
        RolloutFailed: the revision failed (KServe's ``PredictorReady`` message) or was not ready in time.
    """
    def ready(isvc: dict) -> tuple[str, str] | None:
        predictor, conditions = _predictor(isvc), _conditions(isvc)
        created = predictor.get("latestCreatedRevision", "")
        if not created or created == before:
            return None
        failed = conditions.get("PredictorReady", {})
        if failed.get("status") == "False" and failed.get("reason") == "RevisionFailed":
            raise RolloutFailed(f"revision {created} failed: {shorten(failed.get('message', ''), 500)}")
        if conditions.get("Ready", {}).get("status") != "True" or predictor.get("latestReadyRevision") != created:
            return None
        tagged = [t["url"] for t in predictor.get("traffic", []) if t.get("tag") == "latest" and t.get("url")]
        return created, (tagged or [isvc["status"]["url"]])[0]
    return _wait(custom, namespace, name, timeout, "ready new revision", ready)


def _smoke_test(url: str, model_name: str, rows: pd.DataFrame) -> None:
    """POST ``rows`` to ``url`` in ``error`` mode; :class:`RolloutFailed` unless every row is answered."""
    body, _ = table_request(rows, model_name, **{ON_VIOLATION_PARAM: "error"}).to_rest()
    request = urllib.request.Request(f"{url}/v2/models/{model_name}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT[1]) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RolloutFailed(f"smoke test: HTTP {exc.code} from {url}: "
                            f"{shorten(exc.read().decode(errors='replace'), 300)}") from None
    except OSError as exc:
        raise RolloutFailed(f"smoke test: {url} did not answer ({exc})") from None
    counts = {len(o.get("data", [])) for o in answer.get("outputs", [])}
    if counts != {len(rows)}:
        raise RolloutFailed(f"smoke test: {len(rows)} rows sent, outputs of {sorted(counts)} rows answered")


def _record(model_name: str, version: str, outcome: str, reason: str, revision: str) -> None:
    tags = {"rollout": outcome, "rollout_reason": shorten(redact_text(reason), MAX_TAG_CHARS),
            "rollout_at": utc_iso(time.time()), "rollout_revision": revision}
    registry = registry_client()
    for key, value in tags.items():
        registry.set_model_version_tag(model_name, str(version), key, value)
