"""Joining Ray from this process, for the Ray engines (Ray Train's driver, Ray Data's drift and profile passes):
the cluster at ``ray_address`` (a head's ``host:port``, ``ray://head:10001``, the KubeRay head service
``ray://<cluster>-head-svc.<namespace>.svc:10001``, ``auto`` inside a Ray pod) or, when it is empty, a Ray of this
machine alone started for the command on loopback and stopped with it."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray


def init_ray(address: str, *, num_cpus: int | None = None, **options: Any) -> None:
    """``ray.init`` joining ``address``, or starting a local Ray on 127.0.0.1 (with ``num_cpus`` CPUs, None: all of
    this machine's) when it is empty; ``options`` go to ``ray.init`` as they are."""
    local = {} if address else {"num_cpus": num_cpus, "_node_ip_address": "127.0.0.1"}
    ray.init(address=address or None, include_dashboard=False, **local, **options)


@contextmanager
def ray_session(address: str) -> Iterator[None]:
    """Ray joined (:func:`init_ray`) for the ``with`` block, disconnected after it (a local Ray it started is
    stopped)."""
    init_ray(address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
