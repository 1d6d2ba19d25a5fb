"""The Kubeflow Pipelines server through ``kfp.Client``: upload a version per commit, run it, schedule it, and
start retraining runs of a pinned version (at most one in flight). It sits beside the steps because the drift
pipeline's trigger step starts training runs through it; the CLI's server commands use it too.

The server: ``--host``, else (in a pod: the trigger step, ``kfloop serve``) ``KF_PIPELINES_ENDPOINT`` as the KFP SDK
reads it, else ``kfp.host`` of the settings (:class:`KfpSettings`, default the KFP service in ``kubeflow``): never
derived from the profile namespace, where KFP does not run.

Auth comes from the environment only, and none is needed for standalone KFP: ``KFP_TOKEN`` (a bearer token), else
the token file ``KF_PIPELINES_SA_TOKEN_PATH`` (default the projected ``/var/run/secrets/kubeflow/pipelines/token``),
read again before every request so a rotated projected token or a mounted Secret's token keeps working, else
``KFP_COOKIES`` (a ``Cookie`` header value, e.g. ``_oauth2_proxy=...`` behind oauth2-proxy, which the KFP SDK sends
as given; it expires with the proxy's ``cookie_expire``). Tokens and cookies are never taken from flags and never
printed. Without any of them a multi-user KFP (its healthz says so) refuses every call: :func:`connect` says so at
once, naming the token path and the ``access-ml-pipeline`` PodDefault that mounts it.
"""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import certifi
# component_factory first: in a step process (_KFP_RUNTIME=true, where ``kfp`` itself imports no client and no
# ``kfp.Client``) kfp.client's own imports otherwise run into kfp's import cycle around dsl.pipeline_context
import kfp.dsl.component_factory  # noqa: F401
from kfp.client import Client, ServiceAccountTokenVolumeCredentials
from kfp_server_api import ApiException
import urllib3
from urllib3 import Retry
from urllib3.connection import HTTPConnection
from urllib3.exceptions import MaxRetryError

from data.errors import EXIT_SERVICE, KfloopError
from data.redaction import redact
from data.settings import CODE_ROOT, section_from_dict
from monitoring.trigger import RunInFlight
from training.progress import progress

TOKEN_ENV = "KFP_TOKEN"
SA_TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
COOKIES_ENV = "KFP_COOKIES"
ENDPOINT_ENV = "KF_PIPELINES_ENDPOINT"
"""The KFP SDK's own variable for the API endpoint (``kfp.client.client.KF_PIPELINES_ENDPOINT_ENV``)."""
IN_CLUSTER_ENDPOINT = "http://ml-pipeline.kubeflow.svc.cluster.local:8888"
"""The KFP API service of a Kubeflow (and a standalone KFP) install: in ``kubeflow``, whatever the profile."""
DEFAULT_EXPERIMENT = "kfloop"
DEFAULT_SERVICE_ACCOUNT = "kfloop"
"""The service account every run and recurring run we create runs as unless told otherwise: the one deploy/rbac.yaml
makes, with the Lease, job and pipeline-runner rights the steps need (a run without one would run as KFP's
``pipeline-runner``, which has no Lease verbs)."""
IN_FLIGHT = {"PENDING", "RUNNING", "CANCELING", "PAUSED"}
"""Run states that count as a training run in flight."""
FINAL = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}
CRON_FIELDS = 6
REQUEST_TIMEOUT_SECONDS = 30
"""Each KFP API call gives up waiting on the server after this long (connecting, sending, each read)."""
REQUEST_RETRIES = 2
"""Connection failures, and read failures of reads (never of a run's creation), are retried this often."""
WAIT_TRANSIENT_RETRIES = 5
""":func:`wait` asks again after this many transient errors in a row (5xx, no connection), then fails."""
HEALTHZ_PATH = "/apis/v2beta1/healthz"
"""What ``kfp.Client()`` asks at construction, with no deadline of its own (kfp 2.17 ``Client.__init__`` calls
``get_kfp_healthz``, five tries of an unbounded request): :func:`connect` asks it first, within its deadline."""


class KfpUnreachable(KfloopError, ConnectionError):
    """The KFP API did not answer its health check within the deadline; no client was made."""

    exit_code = EXIT_SERVICE


@dataclass(kw_only=True, slots=True, frozen=True)
class VersionRef:
    """One uploaded pipeline version: what a run references instead of an inline spec."""

    pipeline_name: str
    pipeline_id: str
    pipeline_version_id: str
    version_name: str
    code_source_url: str = ""

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form (``kfloop upload`` prints it)."""
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class KfpSettings:
    """The ``kfp:`` section of ``kfloop.yaml``: how pods reach the KFP API."""

    host: str = IN_CLUSTER_ENDPOINT
    """The KFP API URL the trigger step and ``kfloop serve`` use in the cluster when ``KF_PIPELINES_ENDPOINT`` is
    unset; change it where KFP's service lives elsewhere (e.g. another namespace in a standalone install)."""

    def __post_init__(self) -> None:
        check_host(self.host, "kfp.host")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "KfpSettings":
        """Build from the ``kfp:`` section.

        Raises:
            ValueError: an unknown key or a host that is not an http(s) URL.
        """
        return section_from_dict(cls, d, "kfp")


def check_host(host: str, what: str = "--host") -> str:
    """``host`` if it is an http(s) URL.

    Raises:
        ValueError: it is not; the message names ``what``.
    """
    if not re.match(r"https?://[^/\s]+", host):
        raise ValueError(f"{what} {host!r}: use the KFP API URL, e.g. http://localhost:8080, "
                         f"https://kubeflow.example.com/pipeline or {IN_CLUSTER_ENDPOINT}")
    return host


def endpoint(host: str | None, in_cluster_host: str = IN_CLUSTER_ENDPOINT) -> str:
    """The KFP API URL: ``host``, else ``KF_PIPELINES_ENDPOINT``, else ``in_cluster_host`` (``kfp.host``).

    Raises:
        ValueError: the URL is not http(s); the message names where it came from.
    """
    env = os.environ.get(ENDPOINT_ENV)
    return check_host(host or env or in_cluster_host, "--host" if host else ENDPOINT_ENV if env else "kfp.host")


def connect(host: str | None, *, in_cluster_host: str = IN_CLUSTER_ENDPOINT,
            timeout_seconds: int = REQUEST_TIMEOUT_SECONDS) -> Any:
    """A ``kfp.Client`` for ``host``, else ``KF_PIPELINES_ENDPOINT``, else ``in_cluster_host`` (``kfp.host``), with
    the credentials the environment holds (see the module docstring), or none, whose requests give up after
    ``timeout_seconds`` of silence and :data:`REQUEST_RETRIES` retries.

    Raises:
        ValueError: the URL is not http(s).
        KfpUnreachable: the API did not answer its health check within ``timeout_seconds``.
        KfpCredentialsError: no credentials and the server is multi-user.
    """
    host = endpoint(host, in_cluster_host)
    _answers(host, timeout_seconds)
    token = os.environ.get(TOKEN_ENV) or None
    token_file = os.environ.get(SA_TOKEN_PATH_ENV) or SA_TOKEN_PATH
    credentials = (ServiceAccountTokenVolumeCredentials(token_file)
                   if token is None and Path(token_file).is_file() else None)
    cookies = os.environ.get(COOKIES_ENV) or None
    with warnings.catch_warnings():  # kfp warns on every Client() that it needs a v2 server
        warnings.simplefilter("ignore", FutureWarning)
        client = Client(host=host, existing_token=token, credentials=credentials, cookies=cookies)
    _bound_requests(client, timeout_seconds)
    if token is None and credentials is None and cookies is None and _multi_user(client):
        raise KfpCredentialsError(
            f"the KFP API at {host} is multi-user and this process has no credentials: no {TOKEN_ENV}, no "
            f"{COOKIES_ENV}, and no token file at {token_file} ({SA_TOKEN_PATH_ENV}). In a pod the profile's "
            f"`access-ml-pipeline` PodDefault (deploy/kubeflow-profile.yaml) mounts it into pods labelled "
            f"access-ml-pipeline: \"true\" (kfloop compile labels the trigger step): apply it in the namespace")
    return client


class KfpCredentialsError(PermissionError):
    """A multi-user KFP API and no credentials to call it with."""


def _multi_user(client: Any) -> bool:
    """Whether the server says it is multi-user (``GET /apis/v2beta1/healthz``, which KFP answers without
    authentication: ``backend/src/apiserver/main.go`` serves it on its top mux, ``newHealthzResponse``). An
    unreachable server is reported by the call that needs it, not here."""
    try:
        return bool(client._healthz_api.healthz_service_get_healthz().multi_user)
    except (ApiException, MaxRetryError):
        return False


def _answers(host: str, seconds: int) -> None:
    """Raise :class:`KfpUnreachable` unless the KFP API at ``host`` answers ``GET`` :data:`HEALTHZ_PATH` within
    ``seconds`` (to connect, and again to answer): any HTTP answer, even a refusal, shows it answers. A connection
    that fails at once (refused, no such host) raises urllib3's own error, which names its reason."""
    pool = urllib3.PoolManager(ca_certs=certifi.where(), retries=False,
                               timeout=urllib3.Timeout(connect=seconds, read=seconds))
    try:
        pool.request("GET", host.rstrip("/") + HEALTHZ_PATH, preload_content=True)
    except urllib3.exceptions.NewConnectionError:  # a ConnectTimeoutError by class, but no wait: refused at once
        raise
    except urllib3.exceptions.TimeoutError as err:
        raise KfpUnreachable(f"the KFP API at {redact(host)} did not answer its health check within {seconds} s "
                             f"({type(err).__name__}): check --host, KF_PIPELINES_ENDPOINT or kfp.host, and that "
                             "KFP is up") from None
    finally:
        pool.clear()


def _bound_requests(client: Any, seconds: int) -> None:
    """Give every request of ``client`` a deadline and bounded retries. kfp 2.17 has no supported way: ``Client``
    takes no timeout and builds its ``kfp_server_api.Configuration`` itself, and its methods call the generated APIs
    without ``_request_timeout``; so the pool of the one ``ApiClient`` its service APIs share is configured here.
    The KFP SDK sends each request with ``timeout=None``, which overrides any urllib3 pool timeout, so the deadline
    is set on its sockets (``SO_SNDTIMEO`` bounds connecting and sending, ``SO_RCVTIMEO`` each read); urllib3's
    ``Retry`` retries reads of idempotent calls only, never a POST that may have created a run."""
    deadline = struct.pack("ll", seconds, 0)  # struct timeval
    client._run_api.api_client.rest_client.pool_manager.connection_pool_kw.update(
        socket_options=[*HTTPConnection.default_socket_options, (socket.SOL_SOCKET, socket.SO_SNDTIMEO, deadline),
                        (socket.SOL_SOCKET, socket.SO_RCVTIMEO, deadline)],
        retries=Retry(total=REQUEST_RETRIES, backoff_factor=0.5))


def code_source_url(commit: str, cwd: Path = CODE_ROOT) -> str:
    """``<origin as https URL>/tree/<commit>``, credentials stripped; ``''`` without a remote."""
    try:
        remote = subprocess.run(["git", "remote", "get-url", "origin"], cwd=cwd, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    remote = re.sub(r"^git@([^:]+):", r"https://\1/", remote)
    remote = re.sub(r"^(https?://)[^@/]+@", r"\1", remote).removesuffix(".git")
    return f"{remote}/tree/{commit}" if remote.startswith(("http://", "https://")) else ""


def _pages(list_page: Callable[..., Any], items: str, **kwargs: Any) -> Iterator[Any]:
    token = ""
    while True:
        page = list_page(page_token=token, page_size=100, **kwargs)
        yield from getattr(page, items) or []
        token = page.next_page_token
        if not token:
            return


def _name_filter(name: str) -> str:
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "string_value": name}]})


def find_pipeline(client: Any, name: str, namespace: str | None = None) -> str | None:
    """The id of the pipeline named ``name``, or None."""
    found = [p.pipeline_id for p in _pages(client.list_pipelines, "pipelines", filter=_name_filter(name),
                                            namespace=namespace)]
    return found[0] if found else None


def find_version(client: Any, pipeline_name: str, version_name: str, namespace: str | None = None) -> VersionRef:
    """The uploaded version ``version_name`` of ``pipeline_name``.

    Raises:
        LookupError: not uploaded yet (the message says how).
    """
    pipeline_id = find_pipeline(client, pipeline_name, namespace)
    versions = [] if pipeline_id is None else list(_pages(
        client.list_pipeline_versions, "pipeline_versions", pipeline_id=pipeline_id,
        filter=_name_filter(version_name)))
    if not versions:
        raise LookupError(f"pipeline {pipeline_name!r} has no version {version_name!r} on the KFP server: upload it "
                          f"first with `kfloop upload --host URL` (or pass --version NAME of an uploaded one)")
    v = versions[0]
    return VersionRef(pipeline_name=pipeline_name, pipeline_id=pipeline_id, pipeline_version_id=v.pipeline_version_id,
                      version_name=version_name, code_source_url=v.code_source_url or "")


def upload(client: Any, pipeline_name: str, package: Path, *, version_name: str, source_url: str = "",
           namespace: str | None = None, description: str = "") -> tuple[VersionRef, bool]:
    """Create the pipeline (if needed) and its version ``version_name`` with ``source_url``. Idempotent: when the
    version exists it is returned as is. Returns the version and whether it was created now.

    Raises:
        kfp_server_api.ApiException: the server refused (other than "already exists").
    """
    try:
        return find_version(client, pipeline_name, version_name, namespace), False
    except LookupError:
        pass
    if find_pipeline(client, pipeline_name, namespace) is None:
        try:
            client.upload_pipeline(str(package), pipeline_name=pipeline_name, description=description or None,
                                   namespace=namespace)
        except ApiException as err:
            if err.status != 409:  # 409: created meanwhile by someone else
                raise
    pipeline_id = find_pipeline(client, pipeline_name, namespace)
    # kfp.Client.upload_pipeline_version cannot set code_source_url; its own API client (auth, multipart) can
    query = [("name", version_name), ("pipelineid", pipeline_id), ("code_source_url", source_url)]
    try:
        client._upload_api.api_client.call_api(
            "/apis/v2beta1/pipelines/upload_version", "POST", {}, [q for q in query if q[1]],
            {"Accept": "application/json", "Content-Type": "multipart/form-data"},
            files={"uploadfile": str(package)}, response_type="V2beta1PipelineVersion", auth_settings=["Bearer"],
            _return_http_data_only=True)
    except ApiException as err:
        if err.status != 409:
            raise
        return find_version(client, pipeline_name, version_name, namespace), False
    return find_version(client, pipeline_name, version_name, namespace), True


def experiment_id(client: Any, name: str, namespace: str | None = None) -> str:
    """Get or create the experiment ``name``."""
    return client.create_experiment(name, namespace=namespace).experiment_id


def run_name(version: VersionRef, label: str = "") -> str:
    """A run's default name: ``<label> <version> <time>``, the label by default the pipeline's name."""
    return f"{label or version.pipeline_name} {version.version_name[:12]} {time.strftime('%Y%m%d-%H%M%S')}"


def create_run(client: Any, version: VersionRef, params: dict[str, Any], *, experiment: str = DEFAULT_EXPERIMENT,
               namespace: str | None = None, display_name: str = "", service_account: str | None = None) -> Any:
    """Start a run of the uploaded ``version`` (a reference, not an inline spec) in ``experiment``; its pods run as
    ``service_account`` (default :data:`DEFAULT_SERVICE_ACCOUNT`)."""
    name = display_name or run_name(version)
    return client.run_pipeline(experiment_id(client, experiment, namespace), name, params=params,
                               pipeline_id=version.pipeline_id, version_id=version.pipeline_version_id,
                               service_account=service_account or DEFAULT_SERVICE_ACCOUNT)


def wait(client: Any, run_id: str, *, poll_seconds: float = 5.0, timeout_seconds: float | None = None) -> Any:
    """Poll the run until it ends, reporting each state change as a progress line; returns the final run (a failed
    one too: the caller judges it). A transient error of a poll (a 5xx answer, e.g. a gateway's 502 while KFP's API
    server restarts, or no connection) is retried up to :data:`WAIT_TRANSIENT_RETRIES` times in a row, after
    ``poll_seconds`` doubled on each retry.

    Raises:
        TimeoutError: still not finished after ``timeout_seconds``.
        ApiException, MaxRetryError: a 4xx answer, or more transient errors in a row than the bound.
    """
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    last = None
    failures = 0
    while True:
        try:
            run = client.get_run(run_id)
        except (ApiException, MaxRetryError) as err:
            if (isinstance(err, ApiException) and (err.status or 0) < 500) or failures >= WAIT_TRANSIENT_RETRIES:
                raise
            failures += 1
            progress(f"run {run_id}: {_transient(err)}; asking again ({failures}/{WAIT_TRANSIENT_RETRIES})")
            time.sleep(poll_seconds * 2 ** failures)
            continue
        failures = 0
        if run.state != last:
            progress(f"run {run_id}: {run.state}")
            last = run.state
        if run.state in FINAL:
            return run
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.state} after {timeout_seconds} s")
        time.sleep(poll_seconds)


def _transient(err: ApiException | MaxRetryError) -> str:
    """A transient error of :func:`wait`'s poll, in a few words."""
    if isinstance(err, ApiException):
        return f"KFP answered {err.status} {err.reason}"
    return f"no connection to KFP ({type(err.reason).__name__})"


def runs_in_flight(client: Any, pipeline_id: str, *, experiment: str = DEFAULT_EXPERIMENT,
                   namespace: str | None = None) -> list[Any]:
    """Runs of pipeline ``pipeline_id`` in ``experiment`` that are pending or running (any version)."""
    return [r for r in _pages(client.list_runs, "runs", experiment_id=experiment_id(client, experiment, namespace),
                              sort_by="created_at desc", namespace=namespace)
            if r.state in IN_FLIGHT and r.pipeline_version_reference is not None
            and r.pipeline_version_reference.pipeline_id == pipeline_id]


def start_training(client: Any, version: VersionRef, params: dict[str, Any], *,
                   experiment: str = DEFAULT_EXPERIMENT, namespace: str | None = None,
                   service_account: str | None = None, display_name: str = "") -> str:
    """Start a training run of ``version`` unless one of that pipeline is already in flight; returns its run id.
    Its name: ``display_name``, else ``retrain <version> <time>``.

    Raises:
        TrainingInFlight: a run is pending or running (its id is in the message).
    """
    busy = runs_in_flight(client, version.pipeline_id, experiment=experiment, namespace=namespace)
    if busy:
        raise TrainingInFlight(busy[0].run_id, busy[0].state)
    return create_run(client, version, params, experiment=experiment, namespace=namespace,
                      display_name=display_name or run_name(version, "retrain"),
                      service_account=service_account).run_id


class TrainingInFlight(RunInFlight):
    """A training run is pending or running: no second one is started."""

    def __init__(self, run_id: str, state: str):
        super().__init__(f"training run {run_id} is {state}: not starting a second one")
        self.run_id, self.state = run_id, state


def check_cron(cron: str) -> str:
    """``cron`` if it has KFP's 6 fields (seconds first).

    Raises:
        ValueError: another field count; a 5-field expression gets its 6-field form.
    """
    fields = cron.split()
    if len(fields) == CRON_FIELDS:
        return " ".join(fields)
    fix = f": use '0 {' '.join(fields)}' (seconds first)" if len(fields) == 5 else ", e.g. '0 0 * * * *' (hourly)"
    raise ValueError(f"--cron {cron!r} has {len(fields)} fields; KFP recurring runs take 6 "
                     f"(second minute hour day-of-month month day-of-week){fix}")


def schedule(client: Any, version: VersionRef, params: dict[str, Any], *, name: str, cron: str,
             experiment: str = DEFAULT_EXPERIMENT, namespace: str | None = None,
             service_account: str | None = None) -> tuple[str, bool]:
    """Make ``name`` the one recurring run of ``version`` on ``cron`` (max_concurrency=1, no catch-up), its runs'
    pods running as ``service_account`` (default :data:`DEFAULT_SERVICE_ACCOUNT`). An equal one is kept; a
    different one of that name is replaced (the new one is created before the old is deleted). Returns the id and
    whether it was created now.

    Raises:
        ValueError: ``cron`` is not a 6-field expression.
    """
    cron = check_cron(cron)
    exp = experiment_id(client, experiment, namespace)
    same_name = recurring_runs(client, name, exp, namespace)
    service_account = service_account or DEFAULT_SERVICE_ACCOUNT
    wanted = (cron, version.pipeline_version_id, json.dumps(params, sort_keys=True), service_account)
    if len(same_name) == 1 and same_name[0].status == "ENABLED" and _schedule_key(same_name[0]) == wanted:
        return same_name[0].recurring_run_id, False
    created = client.create_recurring_run(exp, name, cron_expression=cron, max_concurrency=1, no_catchup=True,
                                          params=params, pipeline_id=version.pipeline_id,
                                          version_id=version.pipeline_version_id,
                                          service_account=service_account or DEFAULT_SERVICE_ACCOUNT)
    for rec in same_name:
        client.delete_recurring_run(rec.recurring_run_id)
    return created.recurring_run_id, True


def set_schedule_enabled(client: Any, name: str, *, enabled: bool | None, experiment: str = DEFAULT_EXPERIMENT,
                         namespace: str | None = None) -> list[str]:
    """Disable (``False``), or delete (``None``), the recurring runs named ``name``; returns their ids.

    Raises:
        LookupError: there is none of that name.
    """
    found = recurring_runs(client, name, experiment_id(client, experiment, namespace), namespace)
    if not found:
        raise LookupError(f"no recurring run named {name!r} in experiment {experiment!r}")
    for rec in found:
        if enabled is None:
            client.delete_recurring_run(rec.recurring_run_id)
        elif enabled:
            client.enable_recurring_run(rec.recurring_run_id)
        else:
            client.disable_recurring_run(rec.recurring_run_id)
    return [rec.recurring_run_id for rec in found]


def recurring_runs(client: Any, name: str, experiment_id: str, namespace: str | None = None) -> list[Any]:
    """The recurring runs named ``name`` in the experiment."""
    return [r for r in _pages(client.list_recurring_runs, "recurring_runs", experiment_id=experiment_id,
                              namespace=namespace) if r.display_name == name]


def _schedule_key(rec: Any) -> tuple[str, str, str, str]:
    cron = rec.trigger.cron_schedule.cron if rec.trigger and rec.trigger.cron_schedule else ""
    version = rec.pipeline_version_reference.pipeline_version_id if rec.pipeline_version_reference else ""
    params = (rec.runtime_config.parameters if rec.runtime_config else None) or {}
    return cron, version, json.dumps(params, sort_keys=True), rec.service_account or ""
