"""Training input in bounded memory: each rank reads only its shard of the data file, chunk by chunk.

The file's rows are numbered 0..N-1. The seeded validation split marks rows (the same rows the whole-file split
took: a permutation of N). Rank ``r`` of ``W`` owns rows ``[N*r/W, N*(r+1)/W)`` and reads only the Parquet row
groups that overlap them (through ``pyarrow.dataset``; a CSV is parsed chunk by chunk and the other rows are
dropped). The feature transform and the target's encoding (classes and class counts, or a regression target's
mean and standard deviation) are fitted in one streaming pass on rank 0 and broadcast to every rank as JSON. Each epoch a rank visits its row groups and rows in an order seeded by (seed,
epoch, rank) and yields batches; every rank yields ``ceil(train rows / W)`` rows an epoch, as
``DistributedSampler`` does (a short shard starts over, a long one stops early), so all ranks take the same number
of steps. Memory holds the split (one byte a row), one chunk and one batch, not the file.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import torch
import torch.distributed as dist

from data.tables import DEFAULT_LIMITS, ReadLimits, iter_table, table_format
from data.validation import SchemaRoles
from training.features import FeatureFit, FeatureTransform, encode_target, target_classes


@dataclass(frozen=True, slots=True)
class _Piece:
    """Rows ``[start, stop)`` of the file, inside one row group (Parquet) or the whole file (CSV)."""

    fragment: ds.ParquetFileFragment | None
    """The row group's fragment; None for a CSV file."""
    group: int
    """The row group's number in the file."""
    first_row: int
    """Number of the fragment's first row in the file."""
    start: int
    stop: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TargetEncoding:
    """How the target becomes training tensors: class indices, or values standardised with the training rows'
    mean and standard deviation (so the model module sees unit scale whatever the target's units)."""

    classes: list
    """Sorted labels (classification); empty for regression."""
    mean: float = 0.0
    std: float = 1.0

    def encode(self, labels: pd.Series) -> np.ndarray:
        """Class indices (int64) or standardised values (float32)."""
        if self.classes:
            return encode_target(labels, self.classes)
        return ((pd.to_numeric(labels).to_numpy(dtype="float64") - self.mean) / self.std).astype(np.float32)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fitted:
    """What rank 0's pass over the training rows found, the same on every rank."""

    transform: FeatureTransform
    target: TargetEncoding
    class_counts: list[int]
    """Training rows per class, in ``classes`` order (empty for regression)."""

    @property
    def classes(self) -> list:
        """The target's sorted labels; empty for regression."""
        return self.target.classes

    def to_json(self) -> dict:
        """JSON-ready form, as rank 0 broadcasts it."""
        return {"transform": self.transform.to_dict(), "class_counts": self.class_counts,
                "target": {"classes": self.target.classes, "mean": self.target.mean, "std": self.target.std}}

    @classmethod
    def from_json(cls, d: dict) -> "Fitted":
        """Inverse of :meth:`to_json`."""
        return cls(transform=FeatureTransform.from_dict(d["transform"]), target=TargetEncoding(**d["target"]),
                   class_counts=d["class_counts"])


class ShardedTable:
    """One local Parquet or CSV file as numbered rows: the validation split, rank shards and chunked reads."""

    def __init__(self, path: str | Path, *, val_fraction: float, seed: int, source: str,
                 limits: ReadLimits = DEFAULT_LIMITS):
        self.path, self.limits = Path(path), limits
        self.parquet = table_format(self.path, limits) == "parquet"
        if self.parquet:
            fragments = list(ds.dataset(self.path, format="parquet").get_fragments())
            self.row_groups = [(group, group.row_groups[0].num_rows) for fragment in fragments
                               for group in fragment.split_by_row_group()]
            self.num_rows = sum(rows for _, rows in self.row_groups)
        else:
            self.num_rows = sum(len(chunk) for chunk in iter_table(self.path, limits=limits))
        self.is_val = _val_mask(self.num_rows, val_fraction, seed, source)
        self.row_groups_read: list[int] = []
        """Indices of the row groups read so far (Parquet), for tests and benchmarks."""

    @property
    def train_rows(self) -> int:
        """Rows outside the validation split."""
        return int(self.num_rows - self.is_val.sum())

    def shard(self, rank: int, world_size: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` that ``rank`` owns."""
        return self.num_rows * rank // world_size, self.num_rows * (rank + 1) // world_size

    def pieces(self, start: int, stop: int) -> list[_Piece]:
        """The parts of rows ``[start, stop)`` that lie in one row group each, in file order."""
        if not self.parquet:
            return [_Piece(None, 0, 0, start, stop)]
        pieces, first = [], 0
        for number, (group, rows) in enumerate(self.row_groups):
            lo, hi = max(start, first), min(stop, first + rows)
            if lo < hi:
                pieces.append(_Piece(group, number, first, lo, hi))
            first += rows
        return pieces

    def read(self, piece: _Piece, columns: list[str] | None) -> Iterator[pd.DataFrame]:
        """The rows of ``piece`` (``columns``, or all) as frames of at most ``limits.chunk_rows`` rows, indexed by
        row number."""
        if piece.fragment is None:
            for chunk in iter_table(self.path, columns=columns, limits=self.limits):
                if chunk.index[0] >= piece.stop:
                    break
                chunk = chunk.loc[piece.start:piece.stop - 1]
                if len(chunk):
                    yield chunk
            return
        self.row_groups_read.append(piece.group)
        offset = piece.first_row
        for batch in piece.fragment.to_batches(columns=columns, batch_size=self.limits.chunk_rows):
            lo, hi = max(piece.start - offset, 0), min(piece.stop - offset, batch.num_rows)
            if lo < hi:
                frame = batch.slice(lo, hi - lo).to_pandas()
                frame.index = pd.RangeIndex(offset + lo, offset + hi)
                yield frame
            offset += batch.num_rows
            if offset >= piece.stop:
                break

    def chunks(self, start: int, stop: int, columns: list[str] | None) -> Iterator[pd.DataFrame]:
        """Rows ``[start, stop)`` in file order, chunk by chunk."""
        for piece in self.pieces(start, stop):
            yield from self.read(piece, columns)


def _val_mask(n_rows: int, fraction: float, seed: int, source: str) -> np.ndarray:
    """True for the rows of the seeded validation split (the permutation's first ``round(n * fraction)`` rows).

    Raises:
        ValueError: too few rows for ``fraction``.
    """
    n_val = round(n_rows * fraction)
    if n_val < 1 or n_val >= n_rows - 1:
        raise ValueError(f"{source}: {n_rows} rows are too few for val_fraction={fraction}; give more rows or "
                         "change val_fraction")
    mask = np.zeros(n_rows, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n_rows)[:n_val]] = True
    return mask


def fit_on_rank0(table: ShardedTable, roles: SchemaRoles, device: torch.device) -> Fitted:
    """Rank 0 fits the transform on the training rows and the target's encoding (classes over all rows and
    training rows per class; or a regression target's training mean and standard deviation) in one pass; every
    rank gets the result (or rank 0's error, raised as ValueError on every rank)."""
    message: dict | None = None
    if dist.get_rank() == 0:
        try:
            message = {"fitted": _fit(table, roles).to_json()}
        except ValueError as exc:
            message = {"error": str(exc)}
    message = broadcast_json(message, device)
    if "error" in message:
        raise ValueError(message["error"])
    return Fitted.from_json(message["fitted"])


def _fit(table: ShardedTable, roles: SchemaRoles) -> Fitted:
    fit = FeatureFit(numeric=roles.numeric, categorical=roles.categorical)
    regression = roles.task == "regression"
    labels: set = set()
    counts: Counter = Counter()
    nulls = 0
    moments = np.zeros(3)  # regression: training rows, sum, sum of squares (float64)
    for chunk in table.chunks(0, table.num_rows, [*roles.numeric, *roles.categorical, roles.target]):
        target = pd.to_numeric(chunk[roles.target], errors="coerce") if regression else chunk[roles.target]
        nulls += int(target.isna().sum())
        is_train = ~table.is_val[chunk.index.to_numpy()]
        if regression:
            values = target[is_train].to_numpy(dtype="float64")
            moments += (len(values), np.nansum(values), np.nansum(values ** 2))
        else:
            labels.update(target.dropna().unique().tolist())
            counts.update(target[is_train].tolist())
        fit.update(chunk[is_train])
    if nulls and regression:
        raise ValueError(f"target '{roles.target}' has {nulls} null or non-numeric value(s); a regression target "
                         "must be numbers")
    if nulls:
        raise ValueError(f"target '{roles.target}' has {nulls} null label(s); drop or fill them")
    if regression:
        rows, total, squares = moments
        mean = total / rows
        std = float(np.sqrt(max(squares / rows - mean ** 2, 0.0)))
        return Fitted(transform=fit.result(), target=TargetEncoding(classes=[], mean=float(mean),
                                                                    std=std if std > 0 else 1.0), class_counts=[])
    classes = target_classes(pd.Series(sorted(labels), name=roles.target))
    return Fitted(transform=fit.result(), target=TargetEncoding(classes=classes),
                  class_counts=[counts[c] for c in classes])


def broadcast_json(value, device: torch.device):
    """Rank 0's ``value`` on every rank, sent as JSON bytes (no pickle, unlike broadcast_object_list)."""
    data = json.dumps(value).encode() if dist.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if dist.get_rank() == 0
              else torch.empty(int(size), dtype=torch.uint8, device=device))
    dist.broadcast(buffer, src=0)
    return json.loads(bytes(buffer.cpu().numpy()))


class RankInput:
    """One rank's batches and validation rows, read from its shard chunk by chunk."""

    def __init__(self, table: ShardedTable, fitted: Fitted, target: str, *, rank: int, world_size: int, seed: int,
                 batch_size: int, device: torch.device):
        self.table, self.fitted, self.target = table, fitted, target
        self.rank, self.seed, self.batch_size, self.device = rank, seed, batch_size, device
        self.start, self.stop = table.shard(rank, world_size)
        self.columns = [*fitted.transform.numeric, *fitted.transform.categorical, target]
        self.rows_per_epoch = math.ceil(table.train_rows / world_size)
        """Training rows each rank visits an epoch (DistributedSampler's count)."""

    @property
    def steps_per_epoch(self) -> int:
        """Batches :meth:`batches` yields, the same on every rank."""
        return math.ceil(self.rows_per_epoch / self.batch_size)

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's ``steps_per_epoch`` batches of (features, encoded targets) on the device."""
        rng = np.random.default_rng([self.seed, epoch, self.rank])
        pieces = self.table.pieces(self.start, self.stop)
        left, pending = self.rows_per_epoch, []
        while left > 0:
            before = left
            for index in rng.permutation(len(pieces)):
                for chunk in self.table.read(pieces[index], self.columns):
                    x, y = self._encoded(chunk[~self.table.is_val[chunk.index.to_numpy()]])
                    order = rng.permutation(len(y))[:left]
                    left -= len(order)
                    pending.append((x[order], y[order]))
                    yield from self._full_batches(pending)
                    if left == 0:
                        break
                if left == 0:
                    break
            if left == before:
                raise ValueError(f"rank {self.rank} owns no training rows (rows {self.start}-{self.stop}): give "
                                 "more rows or use fewer ranks")
        if pending:
            yield self._tensors(*pending[0])

    def _full_batches(self, pending: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of ``batch_size`` from the front of ``pending``; the remainder stays there as one part."""
        x = np.concatenate([p[0] for p in pending]) if len(pending) > 1 else pending[0][0]
        y = np.concatenate([p[1] for p in pending]) if len(pending) > 1 else pending[0][1]
        full = len(y) // self.batch_size * self.batch_size
        for i in range(0, full, self.batch_size):
            yield self._tensors(x[i:i + self.batch_size], y[i:i + self.batch_size])
        pending[:] = [(x[full:], y[full:])] if full < len(y) else []

    def validation(self, *, whole_file: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The validation rows of this rank's shard (or of the whole file), chunk by chunk, in file order."""
        start, stop = (0, self.table.num_rows) if whole_file else (self.start, self.stop)
        for chunk in self.table.chunks(start, stop, self.columns):
            val = chunk[self.table.is_val[chunk.index.to_numpy()]]
            if len(val):
                yield self._tensors(*self._encoded(val))

    def training_sample(self, max_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Encoded features and targets of the whole file's training split (not only this rank's shard), at most
        about ``max_rows`` of them (a seeded share of each chunk beyond), in file order."""
        keep = min(1.0, max_rows / self.table.train_rows)
        rng = np.random.default_rng([self.seed, 1])
        xs, ys = [], []
        for chunk in self.table.chunks(0, self.table.num_rows, self.columns):
            rows = chunk[~self.table.is_val[chunk.index.to_numpy()]]
            x, y = self._encoded(rows[rng.random(len(rows)) < keep] if keep < 1 else rows)
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def _encoded(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        return self.fitted.transform.transform(rows), self.fitted.target.encode(rows[self.target])

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)
