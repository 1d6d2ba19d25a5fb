"""The promotion lock: one process at a time moves a model's ``champion`` alias (MLflow has no compare-and-set).

On one machine it is a file lock in the workdir. On Kubernetes (the backend says which: :mod:`training.launch.backends`)
it is a ``coordination.k8s.io/v1`` Lease, the object Kubernetes controllers
use for leader election: taken by create or by a replace carrying the ``resourceVersion`` read (the API server
answers 409 to the loser), renewed while held, and taken over when its holder stopped renewing it: as in
client-go's leader election, a record seen unchanged for ``leaseDurationSeconds`` of this process's own clock has
expired (no trust in other nodes' clocks), so a killed pod blocks promotions for one lease duration at most.
Holding the lock is checked again (fenced, :func:`ensure_held`) immediately before the alias moves: a Lease taken
over by another holder, or not renewed for its duration by this process's clock, refuses the move.
deploy/rbac.yaml grants exactly the verbs used: get, create, update.
"""
from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import urllib3
from filelock import BaseFileLock, FileLock
from kubernetes import client
from kubernetes.client import ApiException

from data.errors import KfloopError
from training.launch.kube_client import REQUEST_TIMEOUT, api_client, model_object_name, own_namespace
from training.progress import progress

_UNREACHABLE = (OSError, urllib3.exceptions.HTTPError)
"""What the client raises when the API server cannot be reached (after urllib3's own retries)."""
NAMESPACE_ENV = "KFLOOP_LEASE_NAMESPACE"
"""Namespace of the Lease; unset: the pod's own namespace (outside a pod the kubeconfig's, else ``default``)."""


class LockTimeout(KfloopError, TimeoutError):
    """The promotion lock was not acquired in time; the message names the holder."""


class LockLost(KfloopError, RuntimeError):
    """The lock stopped being ours while held: the Lease was taken by another holder, or not renewed for its
    duration (another promoter may have taken it over)."""


def ensure_held(lock: AbstractContextManager) -> None:
    """Fencing, right before what the lock guards is done: raise :class:`LockLost` unless ``lock`` (a
    :func:`promotion_lock`) is still held by this process.

    Raises:
        LockLost: the lock is no longer ours; the message says why.
        TypeError: ``lock`` is no promotion lock.
    """
    if isinstance(lock, LeaseLock):
        lock.ensure_held()
    elif isinstance(lock, BaseFileLock):
        if not lock.is_locked:
            raise LockLost(f"the promotion lock {lock.lock_file} is not held by this process")
    else:
        raise TypeError(f"{type(lock).__name__} is no promotion lock: use promotion_lock()")


def promotion_lock(model_name: str, workdir: Path, *, kind: str, timeout_s: float = 600,
                   kubeconfig: str = "") -> AbstractContextManager:
    """The lock :func:`training.registry.versions.promote` and :func:`training.registry.versions.rollback` hold for
    ``model_name``: a file lock in ``workdir`` (``kind="file"``) or a Lease reached through ``kubeconfig`` (empty:
    ``$KUBECONFIG`` or in-cluster; ``kind="lease"``). A backend (:mod:`training.launch.backends`) says which."""
    if kind == "file":
        path = workdir / "locks" / f"{model_name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path), timeout=timeout_s)
    if kind != "lease":
        raise ValueError(f"promotion lock kind={kind!r}: use 'file' or 'lease'")
    return LeaseLock(name=lease_name(model_name), namespace=lease_namespace(kubeconfig), api=api_client(kubeconfig),
                     timeout_s=timeout_s)


def lease_name(model_name: str) -> str:
    """``kfloop-promote-<model>-<8 hex>``: a valid object name for any model name, distinct per model."""
    return model_object_name("kfloop-promote", model_name)


def lease_namespace(kubeconfig: str = "") -> str:
    """``KFLOOP_LEASE_NAMESPACE``, else the pod's namespace, else the kubeconfig's (:func:`own_namespace`)."""
    return os.environ.get(NAMESPACE_ENV) or own_namespace(kubeconfig)


def _micro_time(at: datetime | str | None = None) -> str | None:
    """A Kubernetes MicroTime (RFC 3339 with exactly six fraction digits, as the API server parses it) of ``at``
    (a datetime the client read, kept as it is when already a string); now when not given."""
    if isinstance(at, str):
        return at
    return (at or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(kw_only=True)
class LeaseLock(AbstractContextManager):
    """A Kubernetes Lease held as a lock (see the module docstring)."""

    name: str
    namespace: str
    api: Any
    """A ``kubernetes.client.ApiClient``."""
    timeout_s: float = 600
    """How long to wait for the holder to release (or stop renewing) the Lease."""
    duration_s: int = 30
    """``leaseDurationSeconds``: without a renewal for this long the Lease is free to take over."""
    poll_s: float = 0.5
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}")
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _renewer: threading.Thread | None = field(default=None, init=False, repr=False)
    lost: str = field(default="", init=False)
    """Why the Lease stopped being ours while held ('' while it is): :meth:`__exit__` then raises LockLost."""
    _renewed_at: float = field(default=-math.inf, init=False, repr=False)
    """``time.monotonic()`` before the last write that made or kept the Lease ours (its take or a renewal)."""

    def __post_init__(self) -> None:
        self._leases = client.CoordinationV1Api(self.api)

    def _get(self) -> client.V1Lease:
        return self._leases.read_namespaced_lease(self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)

    def _put(self, lease: client.V1Lease) -> None:
        """Replace the Lease with ``lease``, which carries the resourceVersion read: 409 when another wrote since."""
        self._leases.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT)

    def __enter__(self) -> "LeaseLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
        if self.lost and exc[0] is None:
            raise LockLost(self.lost)

    def acquire(self) -> None:
        """Take the Lease, waiting up to ``timeout_s``; then renew it every third of its duration.

        Raises:
            LockTimeout: another holder kept it (named in the message).
            PermissionError: the service account may not use Leases here (the message says how to grant it).
            kubernetes.client.ApiException: the API refused otherwise.
        """
        try:
            self._wait_and_take()
        except ApiException as e:
            if e.status != 403:
                raise
            raise PermissionError(f"the promotion lock needs get, create and update on leases "
                                  f"(coordination.k8s.io) in namespace {self.namespace}: bind deploy/rbac.yaml's "
                                  f"Role kfloop to this step's service account ({e.reason})") from e
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"renew-{self.name}", daemon=True)
        self._renewer.start()

    def ensure_held(self) -> None:
        """Raise :class:`LockLost` unless the Lease is ours: renewed within its duration by this process's clock
        (else another promoter may have taken it over) and, read now, still naming this holder."""
        if self.lost:
            raise LockLost(self.lost)
        unrenewed = time.monotonic() - self._renewed_at
        if unrenewed >= self.duration_s:
            raise LockLost(f"Lease {self.namespace}/{self.name} was last renewed by {self.holder} {unrenewed:.0f} s "
                           f"ago, past its duration of {self.duration_s} s: another promoter may hold it now")
        holder = self._get().spec.holder_identity
        if holder != self.holder:
            raise LockLost(f"Lease {self.namespace}/{self.name} is held by {holder}, no longer by {self.holder}")

    def _wait_and_take(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        seen, seen_at = None, 0.0
        while True:
            try:
                current = self._get()
            except ApiException as e:
                if e.status != 404:
                    raise
                current = None
            holder = current.spec.holder_identity if current else None
            record = current and (holder, current.spec.renew_time, current.metadata.resource_version)
            if record != seen:
                seen, seen_at = record, time.monotonic()
            duration = (current and current.spec.lease_duration_seconds) or self.duration_s
            if current is None or not holder or time.monotonic() - seen_at > duration:
                try:
                    return self._take(current)
                except ApiException as e:
                    if e.status != 409:  # 409: another promoter took or created it first; look again
                        raise
            elif time.monotonic() >= deadline:
                raise LockTimeout(f"Lease {self.namespace}/{self.name} is held by {holder} (renewed "
                                  f"{current.spec.renew_time}); it was not released within {self.timeout_s:g} s")
            time.sleep(self.poll_s)

    def release(self) -> None:
        """Stop renewing and clear the holder, if the Lease is still ours. When the API cannot be reached the
        Lease is left to expire (after ``duration_s``) with a warning: what the lock guarded is done by now."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        try:
            current = self._get()
            if current.spec.holder_identity == self.holder:
                current.spec.holder_identity = None
                current.spec.acquire_time, current.spec.renew_time = None, _micro_time()
                self._put(current)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or already taken over: nothing of ours to clear
                progress(f"promotion lock: could not release Lease {self.namespace}/{self.name} ({e.status} "
                         f"{e.reason}); it expires {self.duration_s} s after its last renewal")
        except _UNREACHABLE as e:
            progress(f"promotion lock: could not release Lease {self.namespace}/{self.name} ({e}); it expires "
                     f"{self.duration_s} s after its last renewal")

    def _take(self, current) -> None:
        started = time.monotonic()
        now = _micro_time()
        spec = client.V1LeaseSpec(holder_identity=self.holder, lease_duration_seconds=self.duration_s,
                                  acquire_time=now, renew_time=now)
        if current is None:
            body = client.V1Lease(metadata=client.V1ObjectMeta(
                name=self.name, labels={"app.kubernetes.io/name": "kfloop"}), spec=spec)
            self._leases.create_namespaced_lease(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
        else:
            spec.lease_transitions = (current.spec.lease_transitions or 0) + 1
            current.spec = spec
            self._put(current)  # carries resourceVersion
        self._renewed_at = started

    def _renew(self) -> None:
        while not self._stop.wait(self.duration_s / 3):
            try:
                current = self._get()
                if current.spec.holder_identity != self.holder:
                    self.lost = (f"Lease {self.namespace}/{self.name} was taken over by "
                                  f"{current.spec.holder_identity} while {self.holder} held it")
                    return
                started = time.monotonic()
                current.spec.acquire_time = _micro_time(current.spec.acquire_time)
                current.spec.renew_time = _micro_time()
                self._put(current)
                self._renewed_at = started
            except (ApiException, *_UNREACHABLE):
                continue  # retried at the next tick; the Lease stays ours until its duration runs out
