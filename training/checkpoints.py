"""Step-numbered training checkpoints, written atomically by rank 0 and verified before use.

Checkpoint ``step`` in the checkpoint directory is two files:

- ``ckpt-<step:08d>.safetensors``: every tensor of the state (model and optimizer state), under ``/``-joined keys;
- ``ckpt-<step:08d>.json``: the sidecar: the rest of the state as JSON (optimizer and scheduler scalars, RNG states,
  epoch, step, ...), the tensors file's sha256 and the torch version. It is written last, so its presence commits
  the checkpoint.

Nothing here pickles: tensors go through safetensors, everything else through JSON.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from data.errors import KfloopError
from data.fileio import atomic_write_bytes, atomic_write_json

logger = logging.getLogger(__name__)

FORMAT = 1
_TENSOR = "__tensor__"
_ITEMS = "__items__"
_SIDECAR = re.compile(r"ckpt-(\d{8})\.json")
_STALE_TEMP = re.compile(r"\.ckpt-\d{8}\.(json|safetensors)\..*\.tmp")
_TENSORS = re.compile(r"ckpt-(\d{8})\.safetensors")


class CheckpointError(KfloopError):
    """A checkpoint that cannot be loaded (missing, truncated, corrupt)."""


class CheckpointVersionError(CheckpointError):
    """A checkpoint saved by another torch minor version: refused, never skipped (its optimizer and RNG states
    may not mean the same thing under this version)."""


def tensors_path(directory: str | Path, step: int) -> Path:
    """Path of the tensors file of checkpoint ``step``."""
    return Path(directory) / f"ckpt-{step:08d}.safetensors"


def sidecar_path(directory: str | Path, step: int) -> Path:
    """Path of the JSON sidecar (the commit marker) of checkpoint ``step``."""
    return Path(directory) / f"ckpt-{step:08d}.json"


def save(directory: str | Path, step: int, state: dict[str, Any], *, keep: int) -> Path:
    """Write ``state`` as checkpoint ``step``; call it on one rank only (rank 0).

    ``state`` is a nested structure of dicts (str or int keys), lists and tuples whose leaves are tensors or JSON
    scalars, such as ``{"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}``. Tuples
    come back as lists. After the commit, stale temp files of interrupted saves and all but the newest ``keep``
    committed checkpoints are removed. Returns the sidecar path.

    Raises:
        ValueError: ``step`` < 0, ``keep`` < 1, or a leaf is neither a tensor nor a JSON scalar.
    """
    if step < 0 or keep < 1:
        raise ValueError(f"step={step}, keep={keep}: use step >= 0 and keep >= 1")
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(state, "", tensors)
    data = save_tensors(tensors)
    atomic_write_bytes(tensors_path(directory, step), data)
    sidecar = {
        "format": FORMAT,
        "step": step,
        "tensors_file": tensors_path(directory, step).name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "torch_version": torch.__version__,
        "state": skeleton,
    }
    path = atomic_write_json(sidecar_path(directory, step), sidecar)
    _clean(Path(directory), keep)
    return path


def committed_steps(directory: str | Path) -> list[int]:
    """Steps that have a sidecar, oldest first (not verified; see :func:`latest_good`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _SIDECAR.fullmatch(p.name)))


def latest_good(directory: str | Path) -> int | None:
    """Step of the newest checkpoint whose tensors file matches its sidecar's sha256, or None if there is none.

    Each newer checkpoint that fails verification (truncated, corrupt, unreadable sidecar) is skipped with a
    warning naming the file and the problem.

    Raises:
        CheckpointVersionError: the newest readable checkpoint was saved by another torch minor version.
    """
    for step in reversed(committed_steps(directory)):
        try:
            _read_verified(directory, step)
        except CheckpointVersionError:
            raise
        except CheckpointError as exc:
            logger.warning("skipping checkpoint step %d: %s; falling back to the previous one", step, exc)
            continue
        return step
    return None


def load(directory: str | Path, step: int) -> dict[str, Any]:
    """The state saved as checkpoint ``step``, with tensors on the CPU.

    Raises:
        CheckpointVersionError: the checkpoint was saved by another torch minor version.
        CheckpointError: the checkpoint is missing, or its tensors file does not match the recorded sha256.
    """
    sidecar, data = _read_verified(directory, step)
    return _join(sidecar["state"], load_tensors(data))


def read_sidecar(directory: str | Path, step: int) -> dict[str, Any]:
    """The parsed sidecar of checkpoint ``step`` (state without its tensors; not verified).

    Raises:
        CheckpointError: the sidecar is missing or not JSON.
    """
    path = sidecar_path(directory, step)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint sidecar") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable sidecar ({exc})") from exc


def _read_verified(directory: str | Path, step: int) -> tuple[dict[str, Any], bytes]:
    sidecar = read_sidecar(directory, step)
    path = tensors_path(directory, step)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: tensors file is missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sidecar.get("sha256"):
        raise CheckpointError(f"{path}: sha256 {digest[:12]}... does not match the sidecar's "
                              f"{str(sidecar.get('sha256'))[:12]}... (truncated or corrupt, {len(data)} bytes)")
    saved_by = str(sidecar.get("torch_version"))
    if _minor(saved_by) != _minor(torch.__version__):
        raise CheckpointVersionError(
            f"{sidecar_path(directory, step)} was saved by torch {saved_by}, this is torch {torch.__version__}: "
            f"resume with torch {'.'.join(_minor(saved_by))}.x, or start over with an empty checkpoint directory")
    return sidecar, data


def _minor(version: str) -> tuple[str, ...]:
    """``("2", "13")`` for ``2.13.0+cpu``."""
    return tuple(version.split("+")[0].split(".")[:2])


def _clean(directory: Path, keep: int) -> None:
    """Remove temp files of interrupted saves, then every checkpoint file but the newest ``keep`` committed ones.

    Old sidecars go before their tensors files, so a crash in between leaves no sidecar without its tensors.
    """
    kept = set(committed_steps(directory)[-keep:])
    for path in directory.iterdir():
        if _STALE_TEMP.fullmatch(path.name):
            path.unlink(missing_ok=True)
    for pattern in (_SIDECAR, _TENSORS):
        for path in directory.iterdir():
            m = pattern.fullmatch(path.name)
            if m and int(m.group(1)) not in kept:
                path.unlink(missing_ok=True)


def _split(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON skeleton of ``value``: tensors move to ``tensors`` under their path and leave a reference behind."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu().contiguous()
        return {_TENSOR: key}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _split(v, _child(key, k), tensors) for k, v in value.items()}
        return {_ITEMS: [[k, _split(v, _child(key, k), tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_split(v, _child(key, i), tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"checkpoint state at '{key or '/'}' is a {type(value).__name__}: store tensors, dicts, "
                     "lists and JSON scalars only")


def _child(key: str, name: Any) -> str:
    return f"{key}/{name}" if key else str(name)


def _join(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`_split`."""
    if isinstance(skeleton, dict):
        if skeleton.keys() == {_TENSOR}:
            return tensors[skeleton[_TENSOR]]
        if skeleton.keys() == {_ITEMS}:
            return {k: _join(v, tensors) for k, v in skeleton[_ITEMS]}
        return {k: _join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_join(v, tensors) for v in skeleton]
    return skeleton
