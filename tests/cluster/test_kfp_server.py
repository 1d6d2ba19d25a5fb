"""The KFP API test server against the real ``kfp.Client`` and raw HTTP: the status codes, bodies and checks of
the real v2beta1 API that kfloop's tests rely on (behaviour from kfp's backend/api/v2beta1 swagger and
backend/src/apiserver: 401 without the bearer token, googleRpcStatus bodies, 409 on names taken, filters, paging)."""

import json
import urllib.error
import urllib.parse
import urllib.request

import kfp
import pytest
from cluster.kfp_server import KfpApiServer, validate_job_inputs
from kfp import compiler, dsl
from kfp_server_api.exceptions import ApiException

TOKEN = "fake-kfp-token-91d2"


@dsl.component(base_image="python:3.11")
def echo(text: str) -> str:
    return text


@dsl.pipeline(name="echo-pipeline")
def echo_pipeline(text: str, times: int = 1) -> None:
    echo(text=text)


@pytest.fixture
def server():
    with KfpApiServer(token=TOKEN) as kfp_server:
        yield kfp_server


@pytest.fixture
def client(server, tmp_path, monkeypatch) -> kfp.Client:
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    return kfp.Client(host=server.url, existing_token=TOKEN)


@pytest.fixture
def package(tmp_path) -> str:
    path = tmp_path / "echo.yaml"
    compiler.Compiler().compile(echo_pipeline, str(path))
    return str(path)


def call(server: KfpApiServer, method: str, path: str, body: dict | None = None,
         token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(server.url + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_healthz_is_open_and_everything_else_needs_the_bearer_token(server):
    status, body = call(server, "GET", "/apis/v2beta1/healthz", token=None)
    assert status == 200 and body["multi_user"] is False
    status, body = call(server, "GET", "/apis/v2beta1/pipelines", token="wrong")
    assert status == 401 and body["code"] == 16 and "bearer token" in body["message"]
    assert call(server, "GET", "/apis/v2beta1/pipelines")[0] == 200


def test_bodies_and_query_parameters_are_checked_against_the_swagger(server):
    status, body = call(server, "POST", "/apis/v2beta1/runs", {"display_name": "x", "colour": "red"})
    assert status == 400 and body["code"] == 3 and '"colour"' in body["message"]
    status, body = call(server, "POST", "/apis/v2beta1/recurringruns", {"display_name": "x", "mode": "SOMETIMES"})
    assert status == 400 and "SOMETIMES" in body["message"]
    status, body = call(server, "GET", "/apis/v2beta1/pipelines?colour=red")
    assert status == 400 and "colour" in body["message"]
    status, body = call(server, "POST", "/apis/v2beta1/runs", {"display_name": "x", "pipeline_version_reference": {
        "pipeline_id": "nope", "pipeline_version_id": "nope"}})
    assert status == 404 and body["code"] == 5


def test_an_operation_it_does_not_serve_answers_501_not_a_fake_success(server):
    status, body = call(server, "POST", "/apis/v2beta1/runs/abc:archive")
    assert status == 501 and "ArchiveRun" in body["message"]


def test_upload_parses_the_multipart_spec_and_refuses_a_taken_name(client, server, package):
    pipeline = client.upload_pipeline(package, pipeline_name="echo")
    assert server.store.pipelines[pipeline.pipeline_id]["name"] == "echo"
    (version,) = server.store.versions.values()
    assert version["pipeline_spec"]["pipelineInfo"]["name"] == "echo-pipeline"
    with pytest.raises(ApiException) as err:
        client.upload_pipeline(package, pipeline_name="echo")
    assert err.value.status == 409
    second = client.upload_pipeline_version(package, pipeline_version_name="v2", pipeline_id=pipeline.pipeline_id)
    assert {v["name"] for v in server.store.versions.values()} == {"echo", "v2"}
    assert second.pipeline_id == pipeline.pipeline_id


def test_a_run_must_give_every_required_parameter_and_no_unknown_one(client, server, package):
    pipeline = client.upload_pipeline(package, pipeline_name="echo")
    version = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions[0]
    experiment = client.create_experiment("exp")
    args = dict(experiment_id=experiment.experiment_id, job_name="r", pipeline_id=pipeline.pipeline_id,
                version_id=version.pipeline_version_id)
    for params, word in (({}, "parameter text is not optional"),
                         ({"text": "a", "colour": "red"}, "not required by pipeline: colour")):
        with pytest.raises(ApiException) as err:
            client.run_pipeline(params=params, **args)
        assert err.value.status == 400 and word in err.value.body
    run = client.run_pipeline(params={"text": "a"}, **args)
    assert server.store.runs[run.run_id]["state"] == "PENDING"


def test_run_states_follow_the_script_one_step_per_get(client, server, package):
    pipeline = client.upload_pipeline(package, pipeline_name="echo")
    version = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions[0]
    server.script_states(["RUNNING", "SUCCEEDED"])
    run = client.run_pipeline(experiment_id=client.create_experiment("exp").experiment_id, job_name="r",
                              params={"text": "a"}, pipeline_id=pipeline.pipeline_id,
                              version_id=version.pipeline_version_id)
    assert [client.get_run(run.run_id).state for _ in range(3)] == ["RUNNING", "SUCCEEDED", "SUCCEEDED"]
    stored = server.store.runs[run.run_id]
    assert [h["state"] for h in stored["state_history"]] == ["PENDING", "RUNNING", "SUCCEEDED"]
    assert "finished_at" in stored


def test_lists_are_filtered_by_predicates_and_paged(client, server, package):
    for name in ("alpha", "beta", "alpine"):
        client.upload_pipeline(package, pipeline_name=name)
    found = client.list_pipelines(filter=json.dumps({"predicates": [
        {"key": "name", "operation": "IS_SUBSTRING", "string_value": "alp"}]}), sort_by="name asc")
    assert [p.name for p in found.pipelines] == ["alpha", "alpine"]
    page = client.list_pipelines(page_size=2, sort_by="name desc")
    assert [p.name for p in page.pipelines] == ["beta", "alpine"] and page.total_size == 3
    rest = client.list_pipelines(page_size=2, page_token=page.next_page_token, sort_by="name desc")
    assert [p.name for p in rest.pipelines] == ["alpha"] and not rest.next_page_token
    status, body = call(server, "GET", "/apis/v2beta1/pipelines?filter=" + urllib.parse.quote(json.dumps(
        {"predicates": [{"key": "colour", "operation": "EQUALS", "string_value": "red"}]})))
    assert status == 400 and "colour" in body["message"]


def test_a_recurring_run_needs_a_six_field_cron(client, server, package):
    pipeline = client.upload_pipeline(package, pipeline_name="echo")
    version = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions[0]
    args = dict(experiment_id=client.create_experiment("exp").experiment_id, job_name="nightly",
                params={"text": "a"}, pipeline_id=pipeline.pipeline_id, version_id=version.pipeline_version_id)
    with pytest.raises(ApiException) as err:
        client.create_recurring_run(cron_expression="0 3 * * *", **args)
    assert err.value.status == 400 and "6 fields" in err.value.body
    rec = client.create_recurring_run(cron_expression="0 0 3 * * *", **args)
    client.disable_recurring_run(rec.recurring_run_id)
    assert server.store.recurring_runs[rec.recurring_run_id]["status"] == "DISABLED"


# -- multi-user mode (tests/cluster/kfp_multiuser.py) -------------------------------------------------------------

@pytest.fixture
def multi_user(tmp_path, monkeypatch):
    """A multi-user server with profile ``team-a`` (owner alice) and a token of its ``default-editor``."""
    from cluster.kfp_multiuser import MultiUser

    monkeypatch.setenv("HOME", str(tmp_path))
    users = MultiUser()
    users.add_profile("team-a", owner="alice@example.com")
    with KfpApiServer(multi_user=users) as kfp_server:
        yield kfp_server, users.service_account_token("team-a", "default-editor")


def test_multi_user_refuses_shared_uploads_and_empty_namespaces_as_kfp_does(multi_user, package):
    server, token = multi_user
    client = kfp.Client(host=server.url, existing_token=token)
    assert call(server, "GET", "/apis/v2beta1/healthz", token=None)[1]["multi_user"] is True

    # a profile's service account may not write shared pipelines (reviewed in KFP's namespace), only its own
    with pytest.raises(ApiException) as err:
        client.upload_pipeline(package, pipeline_name="echo")
    assert err.value.status == 403 and "system:serviceaccount:team-a:default-editor" in err.value.body
    pipeline = client.upload_pipeline(package, pipeline_name="echo", namespace="team-a")
    assert server.store.pipelines[pipeline.pipeline_id]["namespace"] == "team-a"
    review = server.multi_user.reviews
    assert [(r.namespace, r.verb, r.resource, r.allowed) for r in review] == [
        ("kubeflow", "create", "pipelines", False), ("team-a", "create", "pipelines", True)]

    # experiments and runs need a namespace: empty is 400, as in experiment_server.go and run_server.go
    for namespace in (None, ""):
        with pytest.raises(ApiException) as err:
            client.create_experiment("kfloop", namespace=namespace)
        assert err.value.status == 400 and "empty namespace in multi-user mode" in err.value.body
    assert call(server, "GET", "/apis/v2beta1/runs", token=token)[0] == 400
    exp = client.create_experiment("kfloop", namespace="team-a")
    run = client.run_pipeline(exp.experiment_id, "r", pipeline_id=pipeline.pipeline_id,
                              version_id=client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions[0]
                              .pipeline_version_id, params={"text": "hi"})
    assert client.get_run(run.run_id).state == "PENDING"
    status, body = call(server, "POST", "/apis/v2beta1/runs", {"display_name": "r", "pipeline_version_reference": {
        "pipeline_id": pipeline.pipeline_id, "pipeline_version_id": run.pipeline_version_reference
        .pipeline_version_id}, "runtime_config": {"parameters": {"text": "x"}}}, token=token)
    assert status == 400 and "Experiment id can not be empty" in body["message"]


def test_multi_user_identity_is_the_userid_header_or_a_token_for_kfps_audience(multi_user):
    server, _ = multi_user
    users = server.multi_user
    other = users.service_account_token("team-a", "default-editor", audience="https://kubernetes.default.svc")
    assert call(server, "GET", "/apis/v2beta1/experiments?namespace=team-a", token=other)[0] == 401
    assert call(server, "GET", "/apis/v2beta1/experiments?namespace=team-a", token=None)[0] == 401
    outsider = users.service_account_token("team-b", "default-editor")
    status, body = call(server, "GET", "/apis/v2beta1/experiments?namespace=team-a", token=outsider)
    assert status == 403 and body["code"] == 7
    req = urllib.request.Request(server.url + "/apis/v2beta1/experiments?namespace=team-a",
                                 headers={"kubeflow-userid": "alice@example.com"})
    with urllib.request.urlopen(req) as resp:  # the owner through the Istio gateway's header
        assert resp.status == 200
    assert users.reviews[-1].user == "alice@example.com" and users.reviews[-1].allowed


def test_standalone_ignores_namespaces_as_single_user_kfp_does(client, server, package):
    pipeline = client.upload_pipeline(package, pipeline_name="echo", namespace="team-a")
    assert server.store.pipelines[pipeline.pipeline_id]["namespace"] == ""
    assert [p.pipeline_id for p in client.list_pipelines(namespace="team-a").pipelines] == [pipeline.pipeline_id]
    assert client.create_experiment("kfloop", namespace="team-a").namespace in ("", None)


def _root(**parameters: dict) -> dict:
    return {"root": {"inputDefinitions": {"parameters": parameters}}}


@pytest.mark.parametrize("spec, params, error", [
    # backend/src/apiserver/server/run_server_test.go TestCreateRun: "Invalid V2 - missing parameters", "- extra"
    (_root(param1={"parameterType": "STRING"}), {},
     "parameter param1 is not optional, yet has neither default value nor user provided value"),
    (_root(param1={"parameterType": "STRING"}), {"param1": "world", "param2": 1},
     "parameter(s) provided are not required by pipeline: param2"),
    # each branch of validatePipelineJobInputs (template/v2_template.go)
    (_root(n={"parameterType": "NUMBER_INTEGER"}), {"n": "2"},
     "input parameter n requires type double or integer, but the parameter value is not of number value type"),
    (_root(s={"parameterType": "STRING"}), {"s": 3},
     "input parameter s requires type string, but the input parameter is not of string value type"),
    (_root(b={"parameterType": "BOOLEAN"}), {"b": "true"},
     "input parameter b requires type bool, but the input parameter is not of bool value type"),
    (_root(l={"parameterType": "LIST"}), {"l": {"a": 1}},
     "input parameter l requires type list, but the input parameter is not of list value type"),
    (_root(d={"parameterType": "STRUCT"}), {"d": [1]},
     "input parameter d requires type struct, but the input parameter is not of struct value type"),
    (_root(u={}), {"u": 1}, "input parameter u has unspecified type"),
    (_root(f={"parameterType": "TASK_FINAL_STATUS"}), {"f": {}},
     "input parameter f requires type TASK_FINAL_STATUS, which is invalid for root component"),
    (_root(a={"parameterType": "STRING"}), None,
     "pipeline requiring input has no parameter(s) provided. Need parameter(s): a"),
    (_root(c={"parameterType": "STRING", "literals": ["red", "blue"]}), {"c": "green"},
     "input parameter \"c\" value 'green' does not match any of the allowed literal values: ['red', 'blue']"),
])
def test_run_parameters_are_checked_as_validate_pipeline_job_inputs_does(spec, params, error):
    with pytest.raises(ValueError) as refused:
        validate_job_inputs(spec, params)
    assert str(refused.value) == error


@pytest.mark.parametrize("spec, params", [
    (_root(n={"parameterType": "NUMBER_INTEGER"}, x={"parameterType": "NUMBER_DOUBLE"}), {"n": 2, "x": 0.5}),
    (_root(o={"parameterType": "STRING", "isOptional": True, "defaultValue": "a"}), {}),
    (_root(c={"parameterType": "STRING", "literals": ["red", "blue"]}), {"c": "blue"}),
    ({"root": {}}, None),
])
def test_valid_run_parameters_pass(spec, params):
    validate_job_inputs(spec, params)


def test_a_run_with_a_wrongly_typed_parameter_is_refused_at_creation(server, tmp_path):
    client = kfp.Client(host=server.url, existing_token=TOKEN)
    package = tmp_path / "echo.yaml"
    compiler.Compiler().compile(echo_pipeline, str(package))
    with pytest.raises(ApiException) as refused:
        client.create_run_from_pipeline_package(str(package), arguments={"text": "hi", "times": "two"})
    assert refused.value.status == 400
    assert json.loads(refused.value.body)["message"] == (
        "Invalid input error: input parameter times requires type double or integer, but the parameter value is not "
        "of number value type")
    assert server.store.runs == {}


def test_multi_user_records_who_created_a_run_and_reviews_its_termination(multi_user, package):
    server, token = multi_user
    client = kfp.Client(host=server.url, existing_token=token)
    pipeline = client.upload_pipeline(package, pipeline_name="echo", namespace="team-a")
    version = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions[0].pipeline_version_id
    exp = client.create_experiment("kfloop", namespace="team-a")
    run = client.run_pipeline(exp.experiment_id, "r", pipeline_id=pipeline.pipeline_id, version_id=version,
                              params={"text": "hi"})
    assert server.store.created_by == {run.run_id: "system:serviceaccount:team-a:default-editor"}

    outsider = server.multi_user.service_account_token("team-b", "default-editor")
    assert call(server, "POST", f"/apis/v2beta1/runs/{run.run_id}:terminate", {}, token=outsider)[0] == 403
    assert server.store.runs[run.run_id]["state"] == "PENDING"
    client.terminate_run(run.run_id)
    assert server.store.runs[run.run_id]["state"] == "CANCELING"
    assert [(r.verb, r.allowed) for r in server.multi_user.reviews if r.operation == "RunService_TerminateRun"] == [
        ("terminate", False), ("terminate", True)]


def test_answer_next_answers_the_next_requests_with_a_status_then_serves_again(client, server):
    server.answer_next(502, 2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            client.list_experiments()
        assert err.value.status == 502
    assert client.list_experiments().experiments is None
