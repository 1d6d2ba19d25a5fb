"""Atomic file writes, content hashes and UTC timestamps shared by checkpoints, schemas, state files and lineage."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pandas as pd


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    The bytes go to a temp file in the same directory, are fsynced, then ``os.replace``d over ``path``;
    the directory is fsynced so the rename survives a crash. The temp file is removed on any failure.
    """
    return _atomic_write(path, lambda f: f.write(data))


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Copy the file ``source`` to ``path``, streamed, with the guarantees of :func:`atomic_write_bytes`."""
    with open(source, "rb") as src:
        return _atomic_write(path, lambda f: shutil.copyfileobj(src, f, 1 << 20))


def _atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write UTF-8 text (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes; ``md5`` equals the hash DVC records for the file."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parquet_bytes(df: "pd.DataFrame") -> bytes:
    """``df`` as Parquet with fixed writer settings, so equal frames give equal bytes (and equal hashes)."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=3, use_dictionary=True,
                   write_statistics=True, version="2.6", data_page_version="1.0", store_schema=True)
    return buf.getvalue()


def utc_iso(at: float) -> str:
    """``at`` (seconds since the epoch) as UTC ISO 8601, seconds precision."""
    return datetime.fromtimestamp(at, tz=timezone.utc).isoformat(timespec="seconds")
