"""How every kfloop step runs: in the kfloop image, which already holds kfp and the project."""
from __future__ import annotations

import functools

from kfp import dsl

from data.settings import DEFAULT_IMAGE

kfloop_component = functools.partial(dsl.component, base_image=DEFAULT_IMAGE, install_kfp_package=False)
"""``@dsl.component`` for steps that run in the kfloop image (kfp is not pip-installed at step start)."""
