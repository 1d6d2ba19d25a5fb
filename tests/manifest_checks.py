"""Helpers of the manifest tests: `kfloop render-job` as a function, and the Kubernetes "restricted" Pod Security
Standard as a check over pod specs (issue 7 item 16)."""
from __future__ import annotations

import contextlib
import io

import yaml

from pipelines.cli.commands import main

RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}


def restricted_violations(pod: dict) -> list[str]:
    """What in ``pod`` breaks the Kubernetes "restricted" Pod Security Standard (baseline included), plus kfloop's
    own rule of a read-only root filesystem with a writable /tmp."""
    found = []
    pod_sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"pod {key}")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    if pod_sc.get("sysctls"):  # only the "safe" set is allowed; kfloop sets none
        found.append(f"pod sysctls {pod_sc['sysctls']}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume['name']} of type {sorted(kinds)}")
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for c in containers:
        sc, name = c.get("securityContext", {}), c["name"]
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities not dropping ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount {sc['procMount']}")
        selinux = sc.get("seLinuxOptions", pod_sc.get("seLinuxOptions", {})).get("type", "")
        if selinux not in ("", "container_t", "container_init_t", "container_kvm_t"):
            found.append(f"{name}: seLinuxOptions.type {selinux}")
        if sc.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: root filesystem is writable")
        tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        if not tmp or not any("emptyDir" in v for v in pod.get("volumes", []) if v["name"] == tmp[0]["name"]):
            found.append(f"{name}: no emptyDir at /tmp")
    return found


def pods(body: dict) -> dict[str, dict]:
    """Replica type -> pod spec of a PyTorchJob body."""
    return {rtype: spec["template"]["spec"] for rtype, spec in body["spec"]["pytorchReplicaSpecs"].items()}


def render_cli(argv: list[str]) -> dict:
    """The manifest `kfloop render-job ARGV` prints."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["render-job", *argv]) == 0, argv
    return yaml.safe_load(stdout.getvalue())
