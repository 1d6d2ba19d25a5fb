"""A model plug-in's code (:class:`training.config.ModelSpec`): found, hashed, and imported from the bytes that
were hashed, so a version only ever runs the code it was trained with.

The module is imported under a name derived from its sha256 (``kfloop_model_<sha>``), never under its own, so two
versions with different code live side by side in one process and an installed package of the same name is not
touched.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from training.config import ModelSpec
from training.model_files import ModelCodeError


def source_file(module: str) -> Path:
    """The file of ``module``: a path to a ``.py`` file, or the file an importable dotted module comes from.

    Raises:
        ModelCodeError: no such file, or a dotted module that cannot be found or is not one Python file.
    """
    if ModelSpec(module=module).is_file:
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise ModelCodeError(f"model.module={module!r}: no such file ({path}); give the path of the Python "
                                 "file that defines the builder")
        return path
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        found, cause = None, f" ({exc})"
    else:
        cause = ""
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise ModelCodeError(f"model.module={module!r}: not an importable Python module{cause}; install the package "
                             "that holds it in this environment (or the image), or give the path of a .py file")
    return Path(found.origin)


@dataclass(frozen=True, slots=True)
class ModelCode:
    """A model module, imported from exactly the bytes whose sha256 is :attr:`sha256`."""

    spec: ModelSpec
    source: bytes
    """The module file's bytes (copied into every model directory trained with it)."""
    sha256: str
    module: types.ModuleType
    path: Path
    """Where the bytes were read from."""

    @classmethod
    def load(cls, spec: ModelSpec, *, path: Path | None = None, expected_sha256: str | None = None) -> "ModelCode":
        """Read the module of ``spec`` (from ``path`` when given, e.g. the copy in a model directory), check its
        sha256 against ``expected_sha256`` when given, and import it.

        Raises:
            ModelCodeError: the file is missing, its sha256 is not the expected one (nothing is imported then),
                importing it fails, or it has no callable ``spec.builder``.
        """
        path = path or source_file(spec.module)
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise ModelCodeError(f"{path}: cannot read the model module ({exc})") from exc
        sha = hashlib.sha256(source).hexdigest()
        if expected_sha256 is not None and sha != expected_sha256:
            raise ModelCodeError(f"{path}: the model module has sha256 {sha}, but {expected_sha256} was recorded "
                                 "when the version was trained; the copy was modified, so it is not imported. "
                                 "Load the version from its registered artifacts, or train a new version")
        module = _imported(source, sha, path)
        if not callable(getattr(module, spec.builder, None)):
            raise ModelCodeError(f"{path}: defines no function {spec.builder!r} (model.builder); define "
                                 f"{spec.builder}(n_inputs, n_outputs, **params) returning a torch.nn.Module")
        return cls(spec=spec, source=source, sha256=sha, module=module, path=path)

    def build(self, n_inputs: int, n_outputs: int) -> torch.nn.Module:
        """``builder(n_inputs, n_outputs, **params)``.

        Raises:
            ModelCodeError: the builder rejects the params or returns something other than a ``torch.nn.Module``.
        """
        name = f"{self.path.name}:{self.spec.builder}"
        try:
            model = getattr(self.module, self.spec.builder)(n_inputs, n_outputs, **self.spec.params)
        except (TypeError, ValueError) as exc:
            raise ModelCodeError(f"{name}({n_inputs}, {n_outputs}, **{self.spec.params}) failed: {exc}; fix "
                                 "model.params") from exc
        if not isinstance(model, torch.nn.Module):
            raise ModelCodeError(f"{name} returned a {type(model).__name__}, not a torch.nn.Module")
        return model

    @property
    def loss(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """The module's ``loss(outputs, targets)``, or ``None`` (kfloop's loss for the task)."""
        return getattr(self.module, "loss", None)

    def describe(self) -> dict[str, Any]:
        """What ``model.json`` records: the spec and the sha256 of the source."""
        return {"module": self.spec.module, "builder": self.spec.builder, "params": self.spec.params,
                "sha256": self.sha256}


MODULE_PREFIX = "kfloop_model_"
"""The name of an imported model module is this and its source's sha256: no other process can import it."""


def _imported(source: bytes, sha: str, path: Path) -> types.ModuleType:
    """The module executed from ``source`` (once per process per sha256).

    Raises:
        ModelCodeError: executing it raised.
    """
    name = f"{MODULE_PREFIX}{sha}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        raise ModelCodeError(f"{path}: importing the model module failed: {exc!r}") from exc
    return module
