"""KServe v0.20.0's own status, ingress and traffic tests, and those of the knative.dev/pkg condition set it pins
(4a022ed9999a), ported as vectors the Knative-mode functions of cluster/kserve_operator.py must pass.

Tables name the upstream test function and file at tag v0.20.0 (``pkg/apis/serving/v1beta1/``,
``pkg/controller/v1beta1/inferenceservice/reconcilers/knative/`` and ``.../reconcilers/ingress/``) or knative.dev/pkg's
``apis/``; each row is one upstream case, named as upstream names it; the tests with a docstring pin what upstream's
cases leave out. A Knative ``ServiceStatus`` is written as its JSON.

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
* ``ingress_reconciler_test.go`` ``TestCreateVirtualService``, ``TestGetServiceHost``, ``TestGetServiceUrl*``,
  ``TestGetHostPrefix``, ``TestReconcileExternalService_*``, ``TestIngressReconciler_Reconcile_SkipVirtualService``
  (the VirtualService, external Service and host names: the emulation's url is its loopback route's).
* knative.dev/pkg ``condition_set_impl_test.go`` ``TestGetCondition``, ``TestSetCondition``, ``TestIsHappy``,
  ``TestResourceConditions`` (Go accessors), ``TestRemoveNonTerminalConditions`` and
  ``TestClearConditionWithNilManager`` (no condition is cleared); ``condition_set_test.go``'s
  ``TestNewLivingConditionSet`` / ``TestNewBatchConditionSet`` (the set's constructors: only a living set with
  ``Ready`` is emulated). ``ingress_reconciler_test.go`` ``TestNewIngressReconciler`` (a Go constructor).
"""
from __future__ import annotations

import pytest

from cluster.kserve_operator import (TAG_ROUTING, Status, Target, deployment_mode, ingress, ksvc_traffic,
                                     propagate_cross_component_status, propagate_status, route_traffic)

URL = "http://test-predictor-default.default.example.com"
READY = [{"type": "Foo", "status": "True"}, {"type": "RoutesReady", "status": "True"},
         {"type": "ConfigurationsReady", "status": "True"}, {"type": "Ready", "status": "True"}]
"""``TestPropagateStatus``'s conditions of the Knative Service (:362-380)."""


def _condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def _propagated(status: dict, service: dict) -> dict:
    """``status`` (JSON) after ``PropagateStatus`` of ``service``."""
    ss = Status(status)
    propagate_status(ss, service)
    return ss.json


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
    status = _propagated(status, service)
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
    assert _propagated(rolled, service)["components"]["predictor"]["latestRolledoutRevision"] == "r-1"
    service["traffic"][1]["percent"] = 30
    assert _propagated(rolled, service)["components"]["predictor"]["latestRolledoutRevision"] == "r-2"


def test_an_unready_service_keeps_the_url_and_propagates_its_conditions():
    """PropagateStatus :611-632: url and address only from a Ready service; each Knative condition to its
    predictor condition, reason and message kept."""
    before = _propagated({}, {"conditions": READY, "latestReadyRevisionName": "r-1", "url": URL,
                                   "address": {"url": "http://r.default.svc.cluster.local"},
                                   "traffic": [{"revisionName": "r-1", "percent": 100, "latestRevision": True}]})
    failed = {"type": "Ready", "status": "False", "reason": "RevisionFailed", "message": "oom"}
    after = _propagated(before, {"conditions": [failed, {"type": "RoutesReady", "status": "True"},
                                                     {**failed, "type": "ConfigurationsReady"}],
                                      "latestReadyRevisionName": "r-1", "latestCreatedRevisionName": "r-2",
                                      "url": "http://elsewhere",
                                      "traffic": before["components"]["predictor"]["traffic"]})
    predictor = after["components"]["predictor"]
    assert predictor["url"] == URL and predictor["address"] == {"url": "http://r.default.svc.cluster.local"}
    assert predictor["latestCreatedRevision"] == "r-2" and predictor["latestRolledoutRevision"] == "r-1"
    assert {c["type"]: (c["status"], c.get("reason"), c.get("severity")) for c in after["conditions"]} == {
        "PredictorReady": ("False", "RevisionFailed", None), "Ready": ("False", "RevisionFailed", None),
        "PredictorConfigurationReady": ("False", "RevisionFailed", "Info"),
        "PredictorRouteReady": ("True", None, "Info")}


def test_the_observed_generation_is_the_knative_services():
    """PropagateStatus :635: ``observedGeneration`` is the Knative Service's, whatever the InferenceService's was
    (none while the service has observed none: ``omitempty``)."""
    service = {"conditions": READY, "latestReadyRevisionName": "r-1", "observedGeneration": 3}
    assert _propagated({"observedGeneration": 7}, service)["observedGeneration"] == 3
    assert "observedGeneration" not in _propagated({"observedGeneration": 7}, {**service, "observedGeneration": 0})


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
    status = Status({"conditions": [{"type": k, "status": v} for k, v in components.items()]})
    propagate_cross_component_status(status, propagated, kind)
    condition = _condition(status.json, kind)
    assert ((condition["status"], condition.get("reason")) if condition else None) == want


def test_an_unset_component_condition_counts_as_unknown():
    """IsConditionUnknown (inference_service_status.go :329-332): a nil condition is Unknown."""
    status = Status({})
    propagate_cross_component_status(status, ["predictor"], "RoutesReady")
    condition = _condition(status.json, "RoutesReady")
    assert (condition["status"], condition["reason"]) == ("Unknown", "PredictorRouteReady not ready")


# ingress_reconciler_test.go TestIngressReconciler_Reconcile (:1955): the predictor's status, then the url and address
# wanted (the emulation's url is the predictor's own, see kserve_operator.py)
@pytest.mark.parametrize("status, url, address", [
    pytest.param({"components": {"predictor": {"url": "http://svc-predictor.ns"}},
                  "conditions": [{"type": "PredictorReady", "status": "True"}]},
                 "http://svc-predictor.ns", {"url": "http://svc.ns.svc.cluster.local"},
                 id="Istio virtual host enabled, predictor ready, creates virtualservice"),
    pytest.param({"conditions": [{"type": "PredictorReady", "status": "False"}]}, None, None,
                 id="Predictor not ready, does not set URL"),
    pytest.param({}, None, None, id="No components in status, returns nil"),
])
def test_ingress_reconciler_reconcile(status, url, address):
    status = Status(status)
    ingress(status, "svc", "ns")
    assert (status.json.get("url"), status.json.get("address")) == (url, address)


@pytest.mark.parametrize("predictor, ready, url, want", [
    ("Unknown", False, None, ("Unknown", "Predictor ingress not created")),
    ("False", False, None, ("False", "Predictor ingress not created")),
    ("False", True, "http://r", ("True", None)),
    ("True", True, "http://r", ("True", None))])
def test_ingress_follows_the_predictor_until_it_has_a_url(predictor, ready, url, want):
    """ingress_reconciler.go createIngress :487-497: ``IngressReady`` as a not-True ``PredictorReady`` with reason
    ``Predictor ingress not created``; Reconcile :103-122 then sets it True once the predictor has a url (one it kept
    from an earlier Ready service)."""
    status = Status({"components": {"predictor": {"url": "http://r"} if ready else {}}})
    status.initialize()
    status.set("PredictorReady", predictor)
    ingress(status, "svc", "ns")
    condition = _condition(status.json, "IngressReady")
    assert (condition["status"], condition.get("reason")) == want and status.json.get("url") == url


def test_ready_takes_the_most_recently_changed_unhappy_dependent():
    """condition_set.go findUnhappyDependent :303-350: of unhappy terminal conditions, False before Unknown, the most
    recently changed first; within one reconcile the later set (Go's nanoseconds, which JSON's seconds lose)."""
    old = {"conditions": [
        {"type": "IngressReady", "status": "False", "reason": "Newer", "lastTransitionTime": "2026-01-02T00:00:00Z"},
        {"type": "PredictorReady", "status": "False", "reason": "Old", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Ready", "status": "False", "reason": "Old", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    status = Status(old)
    status.set("RoutesReady", "True")
    assert _condition(status.json, "Ready")["reason"] == "Newer"
    for kind, reason in (("IngressReady", "Newest"), ("PredictorReady", "Latest")):
        status.set(kind, "False", reason)
        status.set("RoutesReady", "False")
        status.set("RoutesReady", "True")
        assert _condition(status.json, "Ready")["reason"] == reason
    status.set("IngressReady", "Unknown", "Unknown")
    status.set("RoutesReady", "True", "again")
    assert _condition(status.json, "Ready")["reason"] == "Latest"


def test_stopped_is_false_by_default():
    """controller.go Reconcile :309-317: ``Stopped`` False (a condition outside the set: ``severity: Info``) unless
    set, and then left alone."""
    status = Status({})
    status.initialize()
    status.set("Stopped", "False")
    assert {k: v for k, v in _condition(status.json, "Stopped").items() if k != "lastTransitionTime"} == {
        "type": "Stopped", "status": "False", "severity": "Info"}
    assert _condition(status.json, "Ready")["status"] == "Unknown"


# knative.dev/pkg apis/condition_set_impl_test.go TestMarkTrue (:499) at 4a022ed9999a: conditions (type, status,
# reason, message, severity), the set's dependents (None: the conditions' types), the one marked True, and Ready's
# (status, reason, message) then; each with and without a reason (MarkTrue, MarkTrueWithReason)
READY_FOO = [("Ready", "False", "FooReason", "FooMsg"), ("Foo", "False", "FooReason", "FooMsg")]
CRUFT = [("Bar", "Unknown", "BarReason", "BarMsg", "FYI"), ("Baz", "Unknown", "BazReason", "BazMsg", "LOLJK")]
HAPPY = ("True", None, None)


@pytest.mark.parametrize("reason", ["", "UnitTest"])
@pytest.mark.parametrize("conditions, dependents, mark, want", [
    pytest.param([], None, "Ready", HAPPY, id="no deps"),
    pytest.param([("Ready", "False")], None, "Ready", HAPPY, id="existing conditions, turns happy"),
    pytest.param([("Ready", "False"), ("Foo", "True")], None, "Ready", HAPPY, id="with deps, happy"),
    pytest.param([("Ready", "False", "ReadyReason", "ReadyMsg"), ("Foo", "False", "FooReason", "FooMsg")], None,
                 "Ready", ("False", "FooReason", "FooMsg"), id="with deps, not happy"),
    pytest.param([("Ready", "False"), ("Foo", "False")], None, "Foo", HAPPY, id="update dep, turns happy"),
    pytest.param([("Ready", "Unknown"), ("Foo", "False")], None, "Foo", HAPPY,
                 id="update dep, happy was unknown, turns happy"),
    pytest.param([*READY_FOO, ("Bar", "False", "BarReason", "BarMsg")], None, "Foo", ("False", "BarReason", "BarMsg"),
                 id="update dep 1/2, still not happy"),
    pytest.param([*READY_FOO, ("Bar", "Unknown", "BarReason", "BarMsg"), ("Baz", "False", "BazReason", "BazMsg")],
                 None, "Foo", ("False", "BazReason", "BazMsg"), id="update dep 1/3, mixed status, still not happy"),
    pytest.param([*READY_FOO, ("Bar", "Unknown", "BarReason", "BarMsg"), ("Baz", "Unknown", "BazReason", "BazMsg")],
                 None, "Foo", ("Unknown", "BarReason", "BarMsg"), id="update dep 1/3, unknown status, still not happy"),
    pytest.param(READY_FOO, ("Foo", "Bar", "Baz"), "Foo", ("Unknown", None, None),
                 id="update dep 1/3, unknown status because nil"),
    pytest.param([*READY_FOO, *CRUFT], ("Foo",), "Foo", HAPPY, id="update deps all happy with extra cruft"),
    pytest.param([("Ready", "False", "LongStory", "Set manually"), ("Foo", "False", "FooReason", "FooMsg"), *CRUFT],
                 (), "Foo", HAPPY, id="with no dependents with extra cruft"),
    pytest.param([("Ready", "False", "LongStory", "Set manually"), ("Foo", "True"), *CRUFT], ("Foo",), "Bar", HAPPY,
                 id="happy dependents with extra cruft"),
    pytest.param([("Ready", "False", "LongStory", "Set manually"), ("Foo", "True")], ("Foo", "Bar"), "Foo",
                 ("Unknown", None, None), id="all happy but not cover all dependents"),
    pytest.param([("Ready", "False", "LongStory", "Set manually"), ("Foo", "True"), ("NewCondition", "True")],
                 ("Foo",), "Foo", HAPPY, id="all happy and cover all dependents"),
])
def test_mark_true(conditions, dependents, mark, want, reason):
    fields = ("type", "status", "reason", "message", "severity")
    status = Status({"conditions": [{k: v for k, v in zip(fields, c) if v} for c in conditions]},
                    tuple(c[0] for c in conditions if c[0] != "Ready") if dependents is None else dependents)
    status.initialize()
    status.set(mark, "True", reason)
    ready = status.condition("Ready")
    assert ready["status"] == want[0]
    if want != HAPPY:  # as upstream, the reason of a happy Ready is not checked (MarkTrueWithReason gives it its own)
        assert (ready.get("reason"), ready.get("message")) == want[1:]
    if mark != "Ready":
        assert (status.state(mark), status.condition(mark).get("reason")) == ("True", reason or None)


def _set_of(conditions: list[tuple[str, str]]) -> Status:
    """A status of ``(type, status)`` conditions, ``Ready`` living on the others (``NewLivingConditionSet(getTypes(
    conditions)...)``)."""
    return Status({"conditions": [{"type": t, "status": v} for t, v in conditions]},
                  tuple(t for t, _ in conditions if t != "Ready"))


# condition_set_impl_test.go TestMarkFalse (:846): conditions and the one marked False (Ready is then False)
@pytest.mark.parametrize("conditions, mark", [
    pytest.param([], "Ready", id="no deps"),
    pytest.param([("Ready", "True")], "Ready", id="existing conditions, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True")], "Ready", id="with deps, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "False")], "Ready", id="with deps, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True")], "Foo", id="update dep, turns unhappy"),
    pytest.param([("Ready", "Unknown"), ("Foo", "False")], "Foo", id="update dep, happy was unknown, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True"), ("Bar", "True")], "Foo", id="update dep 1/2, turns unhappy"),
])
def test_mark_false(conditions, mark):
    status = _set_of(conditions)
    status.initialize()
    status.set(mark, "False", "UnitTest", "calm down, just testing")
    assert status.state("Ready") == "False"
    assert {k: v for k, v in status.condition(mark).items() if k in ("status", "reason", "message")} == {
        "status": "False", "reason": "UnitTest", "message": "calm down, just testing"}


# condition_set_impl_test.go TestMarkUnknown (:960): conditions, the one marked Unknown, Ready's status then
@pytest.mark.parametrize("conditions, mark, happy", [
    pytest.param([], "Ready", "Unknown", id="no deps"),
    pytest.param([("Ready", "True")], "Ready", "Unknown", id="existing conditions, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True")], "Ready", "Unknown", id="with deps, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "False"), ("Bar", "False")], "Foo", "False",
                 id="with deps that are false, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True")], "Foo", "Unknown", id="update dep, turns unhappy"),
    pytest.param([("Ready", "Unknown"), ("Foo", "False")], "Foo", "Unknown",
                 id="update dep, happy was unknown, turns unhappy"),
    pytest.param([("Ready", "True"), ("Foo", "True"), ("Bar", "True")], "Foo", "Unknown",
                 id="update dep 1/2, turns unhappy"),
])
def test_mark_unknown(conditions, mark, happy):
    status = _set_of(conditions)
    status.set(mark, "Unknown", "UnitTest", "idk, just testing")
    assert status.state("Ready") == happy
    assert {k: v for k, v in status.condition(mark).items() if k in ("status", "reason", "message")} == {
        "status": "Unknown", "reason": "UnitTest", "message": "idk, just testing"}


# condition_set_impl_test.go TestInitializeConditions (:1045)
@pytest.mark.parametrize("conditions", [
    pytest.param([], id="no conditions is initialized"),
    pytest.param([{"type": "Ready", "status": "Unknown"}], id="initialization is idempotent"),
])
def test_initialize_conditions(conditions):
    status = Status({"conditions": conditions}, ())
    status.initialize()
    assert {k: v for k, v in status.condition("Ready").items() if k != "lastTransitionTime"} == {
        "type": "Ready", "status": "Unknown"}


def test_terminal_initialization():
    """condition_set_impl_test.go TestTerminalInitialization (:1097): a dependent added to a True set starts True."""
    status = Status({}, ("Foo",))
    status.initialize()
    status.set("Foo", "True")
    assert status.state("Ready") == "True"
    status = Status(status.json, ("Foo", "Bar"))
    status.initialize()
    assert len(status.json["conditions"]) == 3 and status.state("Bar") == "True"


def test_condition_severity():
    """condition_set_impl_test.go TestConditionSeverity (:371): a condition outside the set is ``Info``."""
    status = Status({}, ("Foo",))
    status.initialize()
    assert len(status.json["conditions"]) == 2
    status.set("Bar", "False")
    assert {c["type"]: c.get("severity") for c in status.json["conditions"]} == {
        "Ready": None, "Foo": None, "Bar": "Info"}


def test_non_terminal_condition():
    """condition_set_test.go TestNonTerminalCondition (:91): conditions outside the set leave Ready alone."""
    status = Status({}, ("Foo",))
    status.initialize()
    assert len(status.json["conditions"]) == 2
    readiness = []
    for kind, state in (("Foo", "True"), ("Bar", "Unknown"), ("Foo", "Unknown"), ("Foo", "True"), ("Bar", "False")):
        status.set(kind, state)
        readiness.append(status.state("Ready"))
    assert readiness == ["True", "True", "Unknown", "True", "True"]


# condition_set_impl_test.go TestUpdateLastTransitionTime (:270): the condition before, the one set, whether its
# lastTransitionTime changes
@pytest.mark.parametrize("before, state, update", [
    pytest.param({"type": "Ready", "status": "False"}, "True", True, id="LastTransitionTime should be set"),
    pytest.param({"type": "Ready", "status": "False", "lastTransitionTime": "1970-01-01T00:22:17Z"}, "True", True,
                 id="LastTransitionTime should update"),
    pytest.param({"type": "Ready", "status": "False", "lastTransitionTime": "1970-01-01T00:22:17Z"}, "False", False,
                 id="if LastTransitionTime is the only chance, don't do it"),
])
def test_update_last_transition_time(before, state, update):
    status = Status({"conditions": [before]}, ())
    status.set("Ready", state)
    after = _condition(status.json, "Ready")
    assert after["status"] == state
    assert (after.get("lastTransitionTime") != before.get("lastTransitionTime")) is update


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


# utils/utils_test.go TestGetDeploymentMode (:1478), under ``pkg/controller/v1beta1/inferenceservice/``: its
# ``DeployConfig{}`` rows never reach the default, and its ``DefaultDeploymentMode`` row's default is the installed one
@pytest.mark.parametrize("recorded, annotations, want", [
    pytest.param("", {"serving.kserve.io/deploymentMode": "Standard"}, "Standard", id="Standard"),
    pytest.param("", {"serving.kserve.io/deploymentMode": "Knative"}, "Knative", id="ServerlessDeployment"),
    pytest.param("", {"serving.kserve.io/deploymentMode": "ModelMesh"}, "ModelMesh", id="ModelMeshDeployment"),
    pytest.param("", {}, "Knative", id="DefaultDeploymentMode"),
    pytest.param("RawDeployment", {}, "Standard", id="LegacyRawDeploymentInStatus"),
    pytest.param("Serverless", {}, "Knative", id="LegacyServerlessInStatus"),
])
def test_get_deployment_mode(recorded, annotations, want):
    assert deployment_mode({"metadata": {"annotations": annotations}, "status": {"deploymentMode": recorded}}) == want


@pytest.mark.parametrize("recorded, annotation, want", [
    ("", "Serverless", "Knative"), ("", "RawDeployment", "Standard"), ("", "Bogus", "Knative"),
    ("Standard", "Knative", "Standard")])
def test_the_recorded_mode_wins_then_the_parsed_annotation_then_the_default(recorded, annotation, want):
    """utils.go :226-247: the status first, legacy annotations as their successors, an unknown one the default."""
    isvc = {"metadata": {"annotations": {"serving.kserve.io/deploymentMode": annotation}},
            "status": {"deploymentMode": recorded}}
    assert deployment_mode(isvc) == want
