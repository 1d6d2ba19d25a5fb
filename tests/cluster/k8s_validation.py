"""Kubernetes apimachinery's validation helpers and error texts, as the webhooks and the API server of the test
cluster word their refusals (k8s.io/apimachinery v0.31: ``pkg/util/validation/validation.go``,
``pkg/util/validation/field/errors.go``, ``pkg/api/errors/errors.go``)."""
from __future__ import annotations

import json
import re
from typing import Any

DNS1035_LABEL_MAX_LENGTH = 63
"""``DNS1035LabelMaxLength``."""
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL_ERROR = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                       "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                       "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
"""``dns1035LabelErrMsg`` through ``RegexError`` with its examples (the double space is upstream's)."""


DNS1123_SUBDOMAIN_MAX_LENGTH = 253
"""``DNS1123SubdomainMaxLength``."""
_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS1123_SUBDOMAIN_ERROR = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                           "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
                           f"used for validation is '{_DNS1123_SUBDOMAIN_FMT}')")
"""``dns1123SubdomainErrorMsg`` through ``RegexError`` with its example."""


def max_len_error(length: int) -> str:
    """``MaxLenError``."""
    return f"must be no more than {length} characters"


def dns1035_label_errors(value: str) -> list[str]:
    """``IsDNS1035Label``: the length error first, then the format error (each when it applies)."""
    errors = []
    if len(value) > DNS1035_LABEL_MAX_LENGTH:
        errors.append(max_len_error(DNS1035_LABEL_MAX_LENGTH))
    if not _DNS1035_LABEL.fullmatch(value):
        errors.append(DNS1035_LABEL_ERROR)
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: the length error first, then the format error (each when it applies)."""
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH))
    if not re.fullmatch(_DNS1123_SUBDOMAIN_FMT, value):
        errors.append(DNS1123_SUBDOMAIN_ERROR)
    return errors


def go_value(value: Any) -> str:
    """A bad value as ``field.Error.ErrorBody`` prints it: strings quoted (``%q``), numbers and bools plain."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def invalid(path: str, value: Any, detail: str) -> str:
    """``field.Invalid(path, value, detail).Error()``."""
    return f"{path}: Invalid value: {go_value(value)}: {detail}"


def required(path: str, detail: str = "") -> str:
    """``field.Required(path, detail).Error()``."""
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str = "") -> str:
    """``field.Forbidden(path, detail).Error()``."""
    return f"{path}: Forbidden" + (f": {detail}" if detail else "")


def not_supported(path: str, value: Any, supported: list[str]) -> str:
    """``field.NotSupported(path, value, supported).Error()``."""
    return f"{path}: Unsupported value: {go_value(value)}: supported values: " + ", ".join(
        json.dumps(s) for s in supported)


def aggregate(errors: list[str]) -> str:
    """``ErrorList.ToAggregate().Error()``: duplicates dropped, one message as it is, more in brackets."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else f"[{', '.join(unique)}]"


def invalid_object(qualified_kind: str, name: str, errors: list[str]) -> str:
    """``apierrors.NewInvalid(kind, name, errs)``'s message."""
    return f"{qualified_kind} {json.dumps(name)} is invalid: {aggregate(errors)}"


def webhook_denied(webhook: str, message: str) -> str:
    """The API server's message for a validating webhook's denial (``webhookerrors.ToStatusErr``)."""
    return f"admission webhook {json.dumps(webhook)} denied the request: {message}"


def service_refusal(name: str) -> str | None:
    """The API server's refusal of a Service named ``name`` (``ValidateServiceName`` = ``NameIsDNS1035Label``,
    kubernetes ``pkg/apis/core/validation/validation.go``), None when it is a valid name."""
    problems = dns1035_label_errors(name)
    return invalid_object("Service", name, [invalid("metadata.name", name, p) for p in problems]) if problems else None


ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
"""``supportedAccessModes`` (kubernetes ``pkg/apis/core/validation/validation.go``), sorted as ``NotSupported``
lists them."""
VOLUME_MODES = ("Block", "Filesystem")
"""``supportedVolumeModes``."""
SELECTOR_OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}
"""apimachinery ``ValidateLabelSelectorRequirement``: each operator, and whether it needs ``values``."""
CLAIM_FIELDS_NOT_EMULATED = ("dataSource", "dataSourceRef", "volumeAttributesClassName")
"""Claim fields the test cluster neither checks nor provisions from: refused by name, never accepted unread."""


def _selector_errors(selector: dict, path: str) -> list[str]:
    """``metav1validation.ValidateLabelSelector``'s requirement checks (an operator it knows; ``values`` given for
    ``In``/``NotIn``, absent for ``Exists``/``DoesNotExist``)."""
    errors = []
    for i, requirement in enumerate(selector.get("matchExpressions") or []):
        at, operator = f"{path}.matchExpressions[{i}]", requirement.get("operator")
        if operator not in SELECTOR_OPERATORS:
            errors.append(invalid(f"{at}.operator", operator, "not a valid selector operator"))
        elif SELECTOR_OPERATORS[operator] != bool(requirement.get("values")):
            errors.append(required(f"{at}.values", "must be specified when `operator` is 'In' or 'NotIn'")
                          if SELECTOR_OPERATORS[operator] else
                          forbidden(f"{at}.values", "may not be specified when `operator` is 'Exists' or "
                                                    "'DoesNotExist'"))
    return errors


def claim_refusal(claim: dict) -> str | None:
    """The API server's refusal of a PersistentVolumeClaim (``ValidatePersistentVolumeClaimSpec``, kubernetes
    ``pkg/apis/core/validation/validation.go``: at least one access mode, each supported, ``ReadWriteOncePod``
    alone; a ``resources.requests.storage`` greater than zero (``ValidatePositiveQuantityValue``); the selector's
    requirements; a DNS-1123 ``storageClassName`` (``ValidateClassName``); a supported ``volumeMode``), None when it
    passes. :data:`CLAIM_FIELDS_NOT_EMULATED` are refused. Upstream's cases (``validation_test.go``
    ``testValidatePVC``) are ported in tests/cluster/test_k8s_server.py."""
    spec = claim.get("spec") or {}
    modes = spec.get("accessModes") or []
    errors = [required("spec.accessModes", "at least 1 access mode is required")] if not modes else []
    errors += _selector_errors(spec["selector"], "spec.selector") if spec.get("selector") else []
    errors += [not_supported("spec.accessModes", mode, list(ACCESS_MODES)) for mode in modes
               if mode not in ACCESS_MODES]
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        errors.append(forbidden("spec.accessModes", "may not use ReadWriteOncePod with other access modes"))
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage is None:
        errors.append(required("spec.resources[storage]"))
    elif (amount := float(re.match(r"[+-]?[0-9.]*", str(storage))[0] or "0")) <= 0:
        errors.append(invalid("spec.resources[storage]", "0" if amount == 0 else str(storage),
                              "must be greater than zero"))
    if spec.get("storageClassName"):
        errors += [invalid("spec.storageClassName", spec["storageClassName"], problem)
                   for problem in dns1123_subdomain_errors(spec["storageClassName"])]
    if "volumeMode" in spec and spec["volumeMode"] not in VOLUME_MODES:
        errors.append(not_supported("spec.volumeMode", spec["volumeMode"], list(VOLUME_MODES)))
    errors += [forbidden(f"spec.{name}", "not emulated by the test cluster") for name in CLAIM_FIELDS_NOT_EMULATED
               if name in spec]
    name = (claim.get("metadata") or {}).get("name", "")
    return invalid_object("PersistentVolumeClaim", name, errors) if errors else None
