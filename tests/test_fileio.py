"""Atomic writes and copies: readers see the old file or the whole new one, and no temp file stays behind."""
from __future__ import annotations

import os

import pytest

from data.fileio import atomic_copy, atomic_write_bytes


def test_atomic_copy_replaces_the_target_with_the_whole_source(tmp_path):
    source = tmp_path / "data.parquet"
    source.write_bytes(os.urandom(3 << 20) + b"end")  # several copy chunks
    target = atomic_write_bytes(tmp_path / "job" / "data.parquet", b"the previous run's data")
    assert atomic_copy(source, target) == target
    assert target.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in target.parent.iterdir()) == ["data.parquet"]


def test_a_failed_copy_keeps_the_target_and_leaves_no_temp_file(tmp_path):
    target = atomic_write_bytes(tmp_path / "schema.yaml", b"old schema")
    with pytest.raises(IsADirectoryError):
        atomic_copy(tmp_path, target)  # a directory cannot be read as a file
    assert target.read_bytes() == b"old schema"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schema.yaml"]
