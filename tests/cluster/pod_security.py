"""Pod Security admission of the Kubernetes API test server: the ``baseline`` and ``restricted`` profiles enforced on
pods in namespaces labelled ``pod-security.kubernetes.io/enforce``, written from k8s.io/pod-security-admission
(github.com/kubernetes/pod-security-admission, ``policy/check_*.go``, ``policy/registry.go``,
``admission/admission.go``).

What it copies: the checks a training pod can trip (baseline: ``capabilities_baseline``, ``hostNamespaces``,
``hostPathVolumes``, ``privileged``, ``seccompProfile_baseline``; restricted adds ``allowPrivilegeEscalation``,
``capabilities_restricted``, ``restrictedVolumes``, ``runAsNonRoot``, ``runAsUser``, ``seccompProfile_restricted``,
which override the baseline checks of the same concern), evaluated in the registry's order (baseline check IDs
sorted, then restricted ones sorted), init containers first (``visitContainers``), and the refusal's message:
``pods "<name>" is forbidden: violates PodSecurity "restricted:latest": <reason> (<detail>), ...``. Not copied:
AppArmor, SELinux, procMount, sysctls, host ports and probes, Windows, user-namespace relaxations, exemptions,
and the ``audit``/``warn`` modes.
"""
from __future__ import annotations

from typing import Any, Callable

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
"""``capabilities_allowed_1_0`` (``check_capabilities_baseline.go``): the container runtime's default set."""
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret")

Result = tuple[str, str] | None
"""(forbidden reason, detail), or None when the check passes."""


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def _quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"'


def _plural(word: str, plural: str, n: int) -> str:
    return word if n == 1 else plural


def _sc(container: dict) -> dict:
    return container.get("securityContext") or {}


def _named(noun: str, names: list[str]) -> str:
    return f"{_plural(noun, noun + 's', len(names))} {_quote(names)}"


def _capabilities_baseline(spec: dict) -> Result:
    bad, caps = [], set()
    for c in _containers(spec):
        added = set((_sc(c).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            bad.append(c["name"])
            caps |= added
    if bad:
        return "non-default capabilities", f"{_named('container', bad)} must not include {_quote(sorted(caps))} " \
                                           "in securityContext.capabilities.add"
    return None


def _host_namespaces(spec: dict) -> Result:
    shared = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ("host namespaces", ", ".join(shared)) if shared else None


def _host_path_volumes(spec: dict) -> Result:
    bad = [v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    return ("hostPath volumes", _named("volume", bad)) if bad else None


def _privileged(spec: dict) -> Result:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("privileged")]
    return ("privileged", f"{_named('container', bad)} must not set securityContext.privileged=true") if bad else None


def _seccomp(spec: dict, valid: Callable[[Any], bool], required: bool) -> Result:
    pod_profile = (spec.get("securityContext") or {}).get("seccompProfile")
    setters, values, implicit = [], set(), []
    pod_ok = False
    if pod_profile is not None:
        if valid(pod_profile.get("type")):
            pod_ok = True
        else:
            setters.append("pod")
            values.add(pod_profile.get("type"))
    explicit = []
    for c in _containers(spec):
        profile = _sc(c).get("seccompProfile")
        if profile is not None:
            if not valid(profile.get("type")):
                explicit.append(c["name"])
                values.add(profile.get("type"))
        elif not pod_ok:
            implicit.append(c["name"])
    if explicit:
        setters.append(_named("container", explicit))
    if setters:
        return "seccompProfile", f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to " \
                                 f"{_quote(sorted(values))}"
    if required and implicit:
        return "seccompProfile", f'pod or {_named("container", implicit)} must set securityContext.seccompProfile.type ' \
                                 'to "RuntimeDefault" or "Localhost"'
    return None


def _allow_privilege_escalation(spec: dict) -> Result:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if bad:
        return "allowPrivilegeEscalation != false", \
            f"{_named('container', bad)} must set securityContext.allowPrivilegeEscalation=false"
    return None


def _capabilities_restricted(spec: dict) -> Result:
    missing_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _sc(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(c["name"])
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            adding.append(c["name"])
            caps |= added
    details = []
    if missing_drop:
        details.append(f'{_named("container", missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_named('container', adding)} must not include {_quote(sorted(caps))} in "
                       "securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: dict) -> Result:
    bad, kinds = [], set()
    for volume in spec.get("volumes", []):
        kind = next((k for k in volume if k != "name"), "unknown")
        if kind not in RESTRICTED_VOLUME_TYPES:
            bad.append(volume["name"])
            kinds.add(kind)
    if bad:
        kind_words = _plural("restricted volume type", "restricted volume types", len(kinds))
        return "restricted volume types", f"{_named('volume', bad)} {_plural('uses', 'use', len(bad))} " \
                                          f"{kind_words} {_quote(sorted(kinds))}"
    return None


def _run_as_non_root(spec: dict) -> Result:
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    setters = ["pod"] if pod_value is False else []
    explicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsNonRoot") is False]
    implicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsNonRoot") is None and pod_value is not True]
    if explicit:
        setters.append(_named("container", explicit))
    if setters:
        return "runAsNonRoot != true", f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return "runAsNonRoot != true", f"pod or {_named('container', implicit)} must set " \
                                       "securityContext.runAsNonRoot=true"
    return None


def _run_as_user(spec: dict) -> Result:
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    explicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if explicit:
        setters.append(_named("container", explicit))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


_BASELINE = {  # check ID -> check, in the registry's order (sorted IDs)
    "capabilities_baseline": _capabilities_baseline,
    "hostNamespaces": _host_namespaces,
    "hostPathVolumes": _host_path_volumes,
    "privileged": _privileged,
    "seccompProfile_baseline": lambda spec: _seccomp(spec, lambda t: t != "Unconfined", required=False),
}
_RESTRICTED = {  # check ID -> (check, the baseline check it overrides)
    "allowPrivilegeEscalation": (_allow_privilege_escalation, None),
    "capabilities_restricted": (_capabilities_restricted, "capabilities_baseline"),
    "restrictedVolumes": (_restricted_volumes, "hostPathVolumes"),
    "runAsNonRoot": (_run_as_non_root, None),
    "runAsUser": (_run_as_user, None),
    "seccompProfile_restricted": (lambda spec: _seccomp(spec, lambda t: t in ("RuntimeDefault", "Localhost"),
                                                        required=True), "seccompProfile_baseline"),
}


def violations(level: str, pod_spec: dict) -> list[str]:
    """``<reason> (<detail>)`` for every check of ``level`` the pod spec fails, in the admission's order."""
    if level == "privileged":
        return []
    checks: list[Callable[[dict], Result]] = []
    overridden = {base for _, base in _RESTRICTED.values()} if level == "restricted" else set()
    checks += [check for check_id, check in _BASELINE.items() if check_id not in overridden]
    if level == "restricted":
        checks += [check for check, _ in _RESTRICTED.values()]
    found = [result for result in (check(pod_spec) for check in checks) if result]
    return [f"{reason} ({detail})" if detail else reason for reason, detail in found]


def admit(namespace_labels: dict[str, str], pod: dict) -> str | None:
    """None when the namespace's enforced level admits the pod, else the API server's refusal message.

    Raises:
        ValueError: the namespace's enforce label is not a level.
    """
    level = namespace_labels.get(ENFORCE_LABEL, "privileged")
    if level not in LEVELS:
        raise ValueError(f"{ENFORCE_LABEL}={level!r}: not one of {LEVELS}")
    found = violations(level, pod.get("spec") or {})
    if not found:
        return None
    version = namespace_labels.get(ENFORCE_VERSION_LABEL, "latest")
    return f'pods "{pod["metadata"]["name"]}" is forbidden: violates PodSecurity "{level}:{version}": ' \
           + ", ".join(found)
