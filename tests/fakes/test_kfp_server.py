"""The KFP API test server against the real ``kfp.Client`` and raw HTTP: the status codes, bodies and checks of
the real v2beta1 API that kfloop's tests rely on (behaviour from kfp's backend/api/v2beta1 swagger and
backend/src/apiserver: 401 without the bearer token, googleRpcStatus bodies, 409 on names taken, filters, paging)."""

import json
import urllib.error
import urllib.parse
import urllib.request

import kfp
import pytest
from fakes.kfp_server import KfpApiServer
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
    for params, word in (({}, "missing"), ({"text": "a", "colour": "red"}, "unknown")):
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
