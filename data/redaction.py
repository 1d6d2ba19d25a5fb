"""The one redaction of every message kfloop writes: errors, log lines, HTTP answers, run parameters, MLflow tags.

A URL loses its user info (``http://alice:secret@host`` -> ``http://***@host`` in text, the bare host in a URI that
is recorded), its query and fragment (presigned ``X-Amz-Signature``/``X-Amz-Credential``, ``X-Goog-Signature``,
Azure SAS ``sig``...); presigned parameters outside a URL, bearer tokens, and the values of the secret variables in
the environment (:data:`SECRET_ENV`: ``AWS_SECRET_ACCESS_KEY``, ``KFP_TOKEN``, ...) become ``***``. Secrets are read
from the environment when a message is redacted, so a credential set later is still caught.
"""
from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

MASK = "***"
SECRET_ENV = re.compile(r"AWS_ACCESS_KEY_ID|(?!.*_(PATH|FILE|DIR)$).*(SECRET|TOKEN|PASSWORD|_KEY|COOKIES|"
                        r"CONNECTION_STRING|HMAC)\w*")
"""Names of environment variables whose values never appear in a message (``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AZURE_STORAGE_KEY``, ``MLFLOW_TRACKING_PASSWORD``, ``KFP_TOKEN``,
``KFLOOP_WEBHOOK_TOKEN``...); a name ending ``_PATH``, ``_FILE`` or ``_DIR`` holds where a secret is, not the
secret (``KF_PIPELINES_SA_TOKEN_PATH``)."""
MIN_SECRET_CHARS = 6
"""Shorter values (``1``, ``true``) are not searched for: they would mask ordinary words, and are no secret."""
_URL = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/@'\"<>]*@)?(?P<rest>[^\s'\"<>?#]*)"
                  r"(?P<query>[?#][^\s'\"<>]*)?")
_SIGNED = re.compile(r"(?i)\b(X-Amz-(?:Signature|Credential|Security-Token)|X-Goog-(?:Signature|Credential)|sig|"
                     r"AWSAccessKeyId|Signature|token|access_token)=[^\s&'\"<>]+")
_BEARER = re.compile(r"(?i)\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def redact(uri: str | os.PathLike) -> str:
    """``uri`` as it is shown and recorded: without user info (``user:secret@``), query (``?X-Amz-Signature=...``,
    Azure SAS) or fragment, and no secret of the environment in it. A local path is kept as is."""
    text = str(uri)
    parts = urlsplit(text)
    if not parts.scheme or len(parts.scheme) == 1:  # a path (or a Windows drive letter)
        return _without_secret_values(text)
    rest = text[len(parts.scheme) + 1:]  # cut, not rebuilt: sqlite:////abs.db keeps its four slashes
    if rest.startswith("//"):
        rest = "//" + parts.netloc.rpartition("@")[2] + rest[2 + len(parts.netloc):]
    return _without_secret_values(parts.scheme + ":" + re.split(r"[?#]", rest, maxsplit=1)[0])


def redact_text(text: str) -> str:
    """``text`` (a message, a library's error, a parameter or tag value) with every URL's user info masked and its
    query and fragment dropped, presigned parameters and bearer tokens masked, and no secret of the environment."""
    text = _URL.sub(lambda m: m["scheme"] + (f"{MASK}@" if m["userinfo"] else "") + m["rest"], str(text))
    text = _SIGNED.sub(lambda m: f"{m[1]}={MASK}", text)
    text = _BEARER.sub(lambda m: f"{m[1]} {MASK}", text)
    return _without_secret_values(text)


def _without_secret_values(text: str) -> str:
    """``text`` with the values of the environment's secret variables (:data:`SECRET_ENV`) masked."""
    secrets = sorted({v for k, v in os.environ.items() if SECRET_ENV.fullmatch(k) and len(v) >= MIN_SECRET_CHARS},
                     key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text
