"""The image the Docker tests run (``make e2e`` builds it and names it in ``KFLOOP_E2E_IMAGE``): its name, and why
a Docker test is skipped when it cannot run."""
from __future__ import annotations

import os

import docker
import pytest

IMAGE = os.environ.get("KFLOOP_E2E_IMAGE", "")


def _missing() -> str:
    """Why the image cannot be run here ("" when it can)."""
    if not IMAGE:
        return "KFLOOP_E2E_IMAGE names no image"
    try:
        docker.from_env().images.get(IMAGE)
    except docker.errors.DockerException as err:
        return f"no Docker daemon or no image {IMAGE}: {err}"
    return ""


MISSING = _missing()
needs_image = pytest.mark.skipif(bool(MISSING), reason=MISSING or "ok")
"""``pytestmark`` of a test module that runs :data:`IMAGE` on the Docker daemon ``DOCKER_HOST`` names."""
