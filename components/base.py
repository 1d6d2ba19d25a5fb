"""How every kfloop step runs: in the kfloop image, which already holds kfp and the project."""
from __future__ import annotations

import functools

from kfp import dsl

KFLOOP_IMAGE = "ghcr.io/kfloop/kfloop:0.1.0"
"""Default image of every step; `kfloop compile --image` overrides it."""

kfloop_component = functools.partial(dsl.component, base_image=KFLOOP_IMAGE, install_kfp_package=False)
"""``@dsl.component`` for steps that run in the kfloop image (kfp is not pip-installed at step start)."""
