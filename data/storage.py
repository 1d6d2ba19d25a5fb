"""Local paths, PVC mounts and object storage behind one URI, through fsspec.

``s3://`` (AWS S3, MinIO or any S3-compatible store, via s3fs), ``gs://`` (gcsfs, extra ``kfloop[gcs]``) and
``az://``/``abfs://`` (adlfs, extra ``kfloop[azure]``), or a local or mounted path: nothing else
(:func:`check_uri`; no ``http(s)``, ``ftp`` or ``::`` chains, which would make a step pod send requests for whoever
names the URI). Credentials come
only from each library's standard environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL`` for S3-compatible endpoints; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_ACCOUNT_NAME`` / ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_CONNECTION_STRING``). A URI that is logged,
recorded in lineage or printed goes through :func:`data.redaction.redact` first: user info and query parameters
are dropped.
A URI is resolved once (:func:`resolve`) into a :class:`Resolved` that the readers take: its file system, size,
version, md5 and the name it is shown by.
"""
from __future__ import annotations

import functools
import hashlib
import os
import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import fsspec
from botocore.exceptions import (ConnectTimeoutError, EndpointConnectionError, NoCredentialsError,
                                 PartialCredentialsError, ReadTimeoutError)

from data.errors import EXIT_DATA_FILE, KfloopError
from data.redaction import redact, redact_text

REMOTE_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                   "abfss": "adlfs"}
"""Object-store URI schemes and the fsspec package that reads each."""
EXTRAS = {"gcsfs": "gcs", "adlfs": "azure"}
"""The ``kfloop[...]`` extra that installs a package not in the default install."""
CREDENTIALS_HINT = {
    "s3fs": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials), "
            "or run with an instance or pod role",
    "gcsfs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run with workload identity",
    "adlfs": "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_KEY or AZURE_STORAGE_CONNECTION_STRING, or run with "
             "a managed identity",
}
CHUNK_BYTES = 1 << 20
S3_CONNECT_TIMEOUT = 10
"""Seconds an S3 call waits to connect (botocore's default: 60)."""
S3_READ_TIMEOUT = 30
"""Seconds an S3 call waits for each read of the answer (botocore's default: 60)."""
S3_ATTEMPTS = 2
"""botocore's attempts of one S3 call, in its ``standard`` retry mode (its default: 5 in ``legacy`` mode)."""
S3_RETRIES = 1
"""s3fs's own attempts around botocore's (its default 5 would make one call to a silent store last minutes)."""


class StorageError(KfloopError):
    """An object or file that cannot be read: the URI (credentials removed) and what went wrong, with the fix."""

    exit_code = EXIT_DATA_FILE

    def __init__(self, uri: str, problem: str):
        self.uri = redact(uri)
        self.problem = problem
        super().__init__(f"{self.uri}: {problem}")


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """One file, a local or mounted path or an object in storage, resolved once (:func:`resolve`): the file system
    that reads it and what the store says about it. Readers take it instead of the URI, so the URI is parsed,
    checked, stat'ed and redacted once."""

    uri: str
    """The name it is shown and recorded by: credentials removed, a local path made absolute (:func:`record_uri`)."""
    size: int
    """Bytes."""
    version: str
    """The store's version id, else its ETag; empty for local files and stores that have neither."""
    fs: fsspec.AbstractFileSystem = field(repr=False)
    """The file system that reads it, made with the credentials and endpoint in the environment when resolved."""
    path: str = field(repr=False)
    """Its path on :attr:`fs`."""
    given: str = field(repr=False)
    """The URI as given (a presigned URL's query included): error messages name it redacted."""

    @property
    def remote(self) -> bool:
        """Whether it is an object in storage (else a local or mounted file)."""
        return is_remote(self.uri)

    @functools.cached_property
    def md5(self) -> str:
        """md5 of its bytes (the hash DVC records for a file), read on first use, once; :func:`download` hashes the
        bytes it copies on the way.

        Raises:
            StorageError: the file cannot be read.
        """
        try:
            with self.fs.open(self.path, "rb") as f:
                return hashlib.file_digest(f, "md5").hexdigest()
        except Exception as exc:  # every store raises its own types; _problem says which problem it is
            raise _unreadable(self.given, exc) from None  # the library's text may hold credentials


def is_remote(uri: str | os.PathLike) -> bool:
    """True for an object-store URI (``s3://``, ``gs://``, ``az://``, ...), False for a local or mounted path."""
    return isinstance(uri, str) and urlsplit(uri).scheme.lower() in REMOTE_PACKAGES


def check_uri(uri: str | os.PathLike) -> str:
    """``uri`` if kfloop may read it: a local or mounted path, or an object URI of an allowed scheme
    (:data:`REMOTE_PACKAGES`) whose key has no ``.``/``..`` segment, no empty segment (``//``), no query and no
    fragment: such a URI is refused, never normalised, since the store would read another key than the one checked.

    Raises:
        StorageError: the URI breaks one of these rules (named in the message, the URI redacted).
    """
    text = str(uri)
    if "::" in text:
        raise StorageError(text, "rule uri.chain: fsspec '::' chains are not read; give one local path or object URI")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if len(scheme) > 1 and scheme not in REMOTE_PACKAGES:
        raise StorageError(text, f"rule uri.scheme: scheme {scheme!r} is not read; use a local or mounted path or "
                                 "s3://, gs://, az:// or abfs:// (copy the data there first)")
    if not is_remote(text):
        return text
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise StorageError(text, "rule uri.query: a query or fragment is not read (presigned URLs, versionId=); name "
                                 "the object by bucket and key")
    segments = parts.path[1:].split("/")
    if not parts.hostname or any(seg in (".", "..") for seg in segments) or "" in segments[:-1]:
        raise StorageError(text, "rule uri.key: an object URI needs a bucket and a key without '.', '..' or '//' "
                                 "segments (they are refused, not resolved)")
    return text


def location(uri: str | os.PathLike) -> str:
    """``uri`` in the form compared with allowed prefixes: ``scheme://bucket/key`` (no credentials) after
    :func:`check_uri`, or a local path through :func:`os.path.realpath` (links and ``..`` resolved).

    Raises:
        StorageError: as :func:`check_uri`.
    """
    text = check_uri(uri)
    if not is_remote(text):
        return os.path.realpath(text)
    parts = urlsplit(text)
    return f"{parts.scheme.lower()}://{parts.hostname}/{parts.path.lstrip('/')}"


def under_prefix(uri: str | os.PathLike, prefix: str) -> bool:
    """``uri`` is the folder ``prefix`` or lies inside it (``s3://b/data2`` is not under ``s3://b/data``).

    Raises:
        StorageError: either breaks :func:`check_uri`.
    """
    place, base = location(uri), location(prefix).rstrip("/")
    return place == base or place.startswith(base + "/")


def data_folder(uri: str | os.PathLike) -> str:
    """The folder of the data file ``uri`` (as :func:`location`), the allowed prefix derived from a champion's
    lineage.

    Raises:
        StorageError: ``uri`` breaks :func:`check_uri`, or its folder is ``/`` or a bucket's root, which would allow
            every local file or the whole bucket.
    """
    folder = posixpath.dirname(location(uri))
    parts = urlsplit(folder)
    if folder in ("", "/") or (is_remote(folder) and not parts.path.strip("/")):
        raise StorageError(str(uri), f"rule trigger.allowed_data_prefixes: the folder of this data ({redact(folder)}) "
                                     "would allow every file there; set trigger.allowed_data_prefixes to the folders "
                                     "alerts may train on")
    return folder


def holds_credentials(uri: str | os.PathLike) -> bool:
    """True for an object-store URI with user info (``s3://key:secret@bucket/...``): kfloop refuses those and takes
    credentials only from the environment."""
    parts = urlsplit(str(uri))
    return is_remote(uri) and bool(parts.username or parts.password)


def absolute(uri: str | os.PathLike) -> str:
    """``uri`` that means the same from any working directory: an object URI as is, a local path made absolute."""
    return str(uri) if is_remote(uri) else str(Path(uri).resolve())


def record_uri(uri: str | os.PathLike) -> str:
    """The form of ``uri`` kept in lineage and MLflow: :func:`absolute`, then :func:`redact`."""
    return redact(absolute(uri))


def resolve(uri: str | os.PathLike) -> Resolved:
    """The file at ``uri`` (a local or mounted path, or an object URI) with its file system, size and version.

    Raises:
        StorageError: not found, not a file, credentials in the URI, no credentials, access denied, unreachable
            endpoint, or the scheme's package is not installed.
    """
    given = str(uri)
    fs, path = filesystem(given)
    try:
        info = fs.info(path)
    except Exception as exc:  # every store raises its own types; _problem says which problem it is
        raise _unreadable(given, exc) from None  # the library's text may hold credentials
    if info.get("type") != "file":
        raise StorageError(given, "not a file (a directory or prefix): give the URI of one Parquet or CSV object")
    return Resolved(uri=record_uri(given), size=int(info["size"]), version=_version(info), fs=fs, path=path,
                    given=given)


def download(source: Resolved, dest: str | os.PathLike, *, max_bytes: int) -> Resolved:
    """Stream ``source`` into the new file ``dest``, hashing it on the way; at most ``max_bytes``. Returns what was
    read: ``source`` with the size and version the read saw and the md5 of the bytes (not read again).

    Raises:
        StorageError: the file cannot be read, or it grew past ``max_bytes`` while it was read.
    """
    md5 = hashlib.md5()
    size = 0
    try:
        with source.fs.open(source.path, "rb") as src, open(dest, "xb") as out:
            for chunk in iter(lambda: src.read(CHUNK_BYTES), b""):
                size += len(chunk)
                if size > max_bytes:
                    raise StorageError(source.given, f"more than {max_bytes} bytes read, over the limit: split the "
                                                     "data or raise ReadLimits.max_bytes")
                md5.update(chunk)
                out.write(chunk)
            version = _version(getattr(src, "details", None) or {}) or source.version
    except StorageError:
        raise
    except Exception as exc:  # every store raises its own types; _problem says which problem it is
        raise _unreadable(source.given, exc) from None  # the library's text may hold credentials
    read = replace(source, size=size, version=version)
    read.__dict__["md5"] = md5.hexdigest()  # where Resolved.md5 (a cached_property) keeps its value
    return read


def read_bytes(uri: str, *, max_bytes: int) -> bytes:
    """The whole (small) object at ``uri``, e.g. a schema.

    Raises:
        StorageError: see :func:`resolve`; or the object is larger than ``max_bytes``.
    """
    source = resolve(uri)
    if source.size > max_bytes:
        raise StorageError(uri, f"{source.size} bytes, over the limit of {max_bytes} for this file")
    try:
        return source.fs.cat_file(source.path)
    except Exception as exc:  # every store raises its own types; _problem says which problem it is
        raise _unreadable(uri, exc) from None  # the library's text may hold credentials


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """A fresh file system for ``uri``: it reads the credentials and endpoint in the environment now.

    Raises:
        StorageError: the URI breaks :func:`check_uri` or holds credentials (``user:secret@``), or the scheme's package
            is not installed.
    """
    check_uri(uri)
    if holds_credentials(uri):
        raise StorageError(uri, "credentials in the URI: remove 'user:secret@' and give them in the environment "
                                f"instead ({CREDENTIALS_HINT[REMOTE_PACKAGES[urlsplit(uri).scheme.lower()]]})")
    package = REMOTE_PACKAGES.get(urlsplit(str(uri)).scheme.lower())
    try:
        if package != "s3fs":
            return fsspec.core.url_to_fs(str(uri), skip_instance_cache=True)
        fs, path = fsspec.core.url_to_fs(str(uri), skip_instance_cache=True, config_kwargs={
            "connect_timeout": S3_CONNECT_TIMEOUT, "read_timeout": S3_READ_TIMEOUT,
            "retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"}})
        fs.retries = S3_RETRIES
        return fs, path
    except ImportError:
        package = REMOTE_PACKAGES[urlsplit(uri).scheme.lower()]
        extra = EXTRAS[package]
        raise StorageError(uri, f"reading this URI needs the {package} package: pip install 'kfloop[{extra}]'") \
            from None


def _unreadable(uri: str, exc: Exception) -> StorageError:
    """The error for ``exc`` raised reading ``uri``."""
    return StorageError(uri, _problem(exc, uri))


def _version(info: dict) -> str:
    """The version id (S3 ``VersionId``, GCS ``generation``, Azure ``version_id``), else the ETag, unquoted."""
    for key in ("VersionId", "generation", "version_id", "ETag", "etag"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def _problem(exc: Exception, uri: str) -> str:
    """What went wrong reading ``uri``, said for a user, without the URI's credentials."""
    package = REMOTE_PACKAGES.get(urlsplit(uri).scheme.lower(), "")
    if isinstance(exc, FileNotFoundError):
        return "not found: check the bucket, the key and the endpoint" if package else "file not found"
    if isinstance(exc, PermissionError):
        return ("access denied: the credentials in the environment may not read it; check the key pair and the "
                "bucket or IAM policy" if package else f"permission denied: {exc.strerror or exc}")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return f"no credentials: {CREDENTIALS_HINT[package]}"
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        endpoint = urlsplit(exc.kwargs.get("endpoint_url", ""))
        endpoint = redact(f"{endpoint.scheme}://{endpoint.netloc}")
        return f"cannot reach the endpoint {endpoint}: check AWS_ENDPOINT_URL and that the store is running"
    if isinstance(exc, ReadTimeoutError):
        endpoint = urlsplit(exc.kwargs.get("endpoint_url", ""))
        return (f"the endpoint {redact(f'{endpoint.scheme}://{endpoint.netloc}')} did not answer within "
                f"{S3_READ_TIMEOUT} s ({S3_ATTEMPTS * S3_RETRIES} attempts): check that the "
                "store is up and not overloaded")
    return f"cannot read it: {type(exc).__name__}: {redact_text(str(exc).replace(str(uri), redact(uri)))}"
