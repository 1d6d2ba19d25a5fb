"""KServe v0.20.0's own status and traffic tests, ported as vectors the Knative-mode functions of
cluster/kserve_operator.py must pass.

Tables name the upstream test function and file at tag v0.20.0 (``pkg/apis/serving/v1beta1/`` and
``pkg/controller/v1beta1/inferenceservice/reconcilers/knative/``); each row is one upstream case, named as upstream
names it; the tests with a docstring pin what upstream's cases leave out. A Knative ``ServiceStatus`` is
written as its JSON.

Not ported, as the emulation does not model what they test:

* ``inference_service_status_test.go`` ``TestInferenceServiceDuckType`` (a Go type check),
  ``TestPropagateRawStatus*``, ``TestGetDeploymentCondition_*``, ``TestPropagateRawStatus_MultiNode_*`` (raw
  deployment mode: Deployments, not Knative), ``TestInferenceServiceStatus_PropagateModelStatus``,
  ``TestPropagateModelStatus_ReadyPodsCountingOnly``, ``TestInferenceServiceStatus_UpdateModelRevisionStates``
  (``modelStatus``: the emulation writes only ``RuntimeNotRecognized``'s), ``TestInferenceServiceStatus_ClearCondition``
  (the emulation clears no condition).
* ``ksvc_reconciler_test.go`` ``TestCreateKnativeService``'s and ``TestKsvcReconciler_Reconcile``'s assertions on the
  Knative Service object itself (name, autoscaling and managed annotations, timeouts, concurrency, labels, the
  dry-run update): the emulation keeps no Service object, only its traffic. ``TestKsvcReconciler_Reconcile``'s
  "Create a new service when it doesn't exist" and "No update when service is identical" assert only that.
"""
from __future__ import annotations

import pytest

from cluster.kserve_operator import (TAG_ROUTING, Target, ksvc_traffic, propagate_cross_component_status,
                                     propagate_status, route_traffic)

URL = "http://test-predictor-default.default.example.com"
READY = [{"type": "Foo", "status": "True"}, {"type": "RoutesReady", "status": "True"},
         {"type": "ConfigurationsReady", "status": "True"}, {"type": "Ready", "status": "True"}]
"""``TestPropagateStatus``'s conditions of the Knative Service (:362-380)."""


def _condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


# inference_service_status_test.go TestPropagateStatus (:350); rolled_out is what PropagateStatus (:582-605) leaves
@pytest.mark.parametrize("service, status, is_ready, rolled_out", [
    pytest.param({"conditions": READY, "latestReadyRevisionName": "test-predictor-default-0001",
                  "traffic": [{"revisionName": "test-predictor-default-0001", "percent": 100, "latestRevision": True}],
                  "address": {}, "url": URL},
                 {}, True, "test-predictor-default-0001", id="Status with Traffic Routing for Latest Revision"),
    pytest.param({"conditions": READY, "latestReadyRevisionName": "test-predictor-default-0001",
                  "latestCreatedRevisionName": "test-predictor-default-0001",
                  "traffic": [{"revisionName": "test-predictor-default-0001", "percent": 90, "latestRevision": True}],
                  "address": {}, "url": URL},
                 {"components": {"predictor": {"latestRolledoutRevision": "test-predictor-default-0001"}}}, True,
                 "test-predictor-default-0001", id="Status with Traffic Routing for Rolledout Revision"),
])
def test_propagate_status(service, status, is_ready, rolled_out):
    status = propagate_status(status, service)
    predictor = status["components"]["predictor"]
    assert (_condition(status, "PredictorReady").get("status") == "True") is is_ready, status["conditions"]
    assert predictor["traffic"][0] == service["traffic"][0]
    assert predictor["latestRolledoutRevision"] == rolled_out
    assert predictor["url"] == URL and predictor["latestReadyRevision"] == service["latestReadyRevisionName"]


def test_a_revision_rolled_out_then_split_with_itself_rolls_back():
    """PropagateStatus :591-603: the latest ready (and created) revision at under 100 percent of its own 100 is a
    rollback, so ``latestRolledoutRevision`` returns to ``previousRolledoutRevision``."""
    rolled = {"components": {"predictor": {"latestRolledoutRevision": "r-2", "previousRolledoutRevision": "r-1"}}}
    service = {"conditions": READY, "latestReadyRevisionName": "r-2", "latestCreatedRevisionName": "r-2",
               "traffic": [{"revisionName": "r-2", "percent": 60, "latestRevision": True},
                           {"revisionName": "r-2", "percent": 40, "latestRevision": False}]}
    assert propagate_status(rolled, service)["components"]["predictor"]["latestRolledoutRevision"] == "r-1"
    service["traffic"][1]["percent"] = 30
    assert propagate_status(rolled, service)["components"]["predictor"]["latestRolledoutRevision"] == "r-2"


def test_an_unready_service_keeps_the_url_and_propagates_its_conditions():
    """PropagateStatus :611-632: url and address only from a Ready service; each Knative condition to its
    predictor condition, reason and message kept."""
    before = propagate_status({}, {"conditions": READY, "latestReadyRevisionName": "r-1", "url": URL,
                                   "address": {"url": "http://r.default.svc.cluster.local"},
                                   "traffic": [{"revisionName": "r-1", "percent": 100, "latestRevision": True}]})
    failed = {"type": "Ready", "status": "False", "reason": "RevisionFailed", "message": "oom"}
    after = propagate_status(before, {"conditions": [failed, {"type": "RoutesReady", "status": "True"},
                                                     {**failed, "type": "ConfigurationsReady"}],
                                      "latestReadyRevisionName": "r-1", "latestCreatedRevisionName": "r-2",
                                      "url": "http://elsewhere",
                                      "traffic": before["components"]["predictor"]["traffic"]})
    predictor = after["components"]["predictor"]
    assert predictor["url"] == URL and predictor["address"] == {"url": "http://r.default.svc.cluster.local"}
    assert predictor["latestCreatedRevision"] == "r-2" and predictor["latestRolledoutRevision"] == "r-1"
    assert {c["type"]: (c["status"], c.get("reason")) for c in after["conditions"]} == {
        "PredictorReady": ("False", "RevisionFailed"), "PredictorConfigurationReady": ("False", "RevisionFailed"),
        "PredictorRouteReady": ("True", None)}


ALL = ["predictor", "explainer", "transformer"]


# inference_service_status_test.go TestPropagateCrossComponentStatus (:2155): the components' conditions, those
# propagated, the aggregate's kind, and its (status, reason) or None when it is not set
@pytest.mark.parametrize("components, propagated, kind, want", [
    pytest.param({"PredictorRouteReady": "True", "ExplainerRoutesReady": "True", "TransformerRouteReady": "True"},
                 ALL, "RoutesReady", ("True", None), id="All components ready sets RoutesReady True"),
    pytest.param({"PredictorRouteReady": "True", "ExplainerRoutesReady": "False", "TransformerRouteReady": "True"},
                 ALL, "RoutesReady", ("False", "ExplainerRoutesReady not ready"),
                 id="One component not ready sets RoutesReady False"),
    pytest.param({"PredictorRouteReady": "True", "ExplainerRoutesReady": "Unknown", "TransformerRouteReady": "True"},
                 ALL, "RoutesReady", ("Unknown", "ExplainerRoutesReady not ready"),
                 id="One component unknown sets RoutesReady Unknown"),
    pytest.param({}, [], "RoutesReady", ("True", None), id="No components sets nothing"),
    pytest.param({}, ["predictor"], "UnknownConditionType", None, id="Unknown conditionType does nothing"),
    pytest.param({"PredictorConfigurationReady": "True", "ExplainerConfigurationReady": "True",
                  "TransformerConfigurationReady": "True"},
                 ALL, "LatestDeploymentReady", ("True", None),
                 id="All components ready sets LatestDeploymentReady True"),
    pytest.param({"PredictorConfigurationReady": "True", "ExplainerConfigurationReady": "False",
                  "TransformerConfigurationReady": "True"},
                 ALL, "LatestDeploymentReady", ("False", "ExplainerConfigurationReady not ready"),
                 id="One component not ready sets LatestDeploymentReady False"),
])
def test_propagate_cross_component_status(components, propagated, kind, want):
    status = {"conditions": [{"type": k, "status": v} for k, v in components.items()]}
    condition = _condition(propagate_cross_component_status(status, propagated, kind), kind)
    assert ((condition["status"], condition.get("reason")) if condition else None) == want


def test_an_unset_component_condition_counts_as_unknown():
    """IsConditionUnknown (inference_service_status.go :329-332): a nil condition is Unknown."""
    condition = _condition(propagate_cross_component_status({}, ["predictor"], "RoutesReady"), "RoutesReady")
    assert (condition["status"], condition["reason"]) == ("Unknown", "PredictorRouteReady not ready")


# ksvc_reconciler_test.go TestCreateKnativeService (:40) and TestKsvcReconciler_Reconcile (:199): componentMeta with
# enable-tag-routing, componentStatus.LatestRolledoutRevision "test-revision-1"
@pytest.mark.parametrize("canary, want", [
    pytest.param(20, [Target("", 20, True, "latest"), Target("test-revision-1", 80, False, "prev")],
                 id="With canary traffic split"),
    pytest.param(None, [Target("", 100, True, "latest")], id="Without canary traffic"),
    pytest.param(100, [Target("", 100, True, "latest")], id="With canary 100 percent"),
    pytest.param(20, [Target("", 20, True, "latest"), Target("test-revision-1", 80, False, "prev")],
                 id="Update existing service with different configuration"),
])
def test_create_knative_service_traffic(canary, want):
    assert ksvc_traffic(canary, "test-revision-1", {"app": "test-app", TAG_ROUTING: "true"}) == want


@pytest.mark.parametrize("canary, rolled_out, tags", [(None, "r-1", [""]), (20, "", [""]), (100, "r-1", [""]),
                                                      (20, "r-1", ["", "prev"])])
def test_without_tag_routing_only_the_previous_revision_is_tagged(canary, rolled_out, tags):
    """ksvc_reconciler.go :139-161: ``latest`` only under the annotation, ``prev`` always."""
    assert [t.tag for t in ksvc_traffic(canary, rolled_out, {TAG_ROUTING: "false"})] == tags


def test_the_route_resolves_latest_revision_targets_to_the_latest_ready_revision():
    """Knative's route: ``latestRevision`` follows the latest ready revision; no traffic while there is none."""
    spec = ksvc_traffic(20, "r-1", {})
    assert route_traffic(spec, "r-2") == [Target("r-2", 20, True), Target("r-1", 80, False, "prev")]
    assert route_traffic(spec, "") == []
