"""One rank's training input over one epoch, without training: peak memory must not grow with the file.

    python -m benchmarks.train_input PATH --rank R --world-size W [--batch-size 256] [--target COLUMN]
                                          [--schema FILE] [--chunk-rows N]

Runs what ``training.train`` runs before and around the model on rank ``R`` of ``W``: the streaming fit pass (rank
0's job; done here on every rank, so the figure is the busiest rank's), one epoch of batches of the rank's shard
(summed, as a stand-in for training) and its validation rows. Prints one JSON line ``{rows, seconds,
peak_rss_gib, ...}``; peak RSS is the process's high-water mark from ``resource.getrusage``.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from data.tables import DEFAULT_LIMITS, ReadLimits
from data.validation import SchemaRoles, infer_schema, load_schema, schema_roles
from training.inputs import RankInput, ShardedTable, fit_on_rank0

KIB_PER_GIB = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_input", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="Parquet or CSV training data (local)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--schema", help="kfloop schema YAML; default: inferred from the file's first chunk")
    parser.add_argument("--target", default="target", help="target column when the schema is inferred")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_LIMITS.chunk_rows)
    parser.add_argument("--val-fraction", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is not in [0, --world-size {args.world_size})")
    return args


def _roles(args: argparse.Namespace, table: ShardedTable) -> SchemaRoles:
    if args.schema:
        return schema_roles(load_schema(args.schema))
    first = next(table.chunks(0, min(table.num_rows, 10_000), columns=None))
    return schema_roles(infer_schema(first, target=args.target, id_columns=[]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        table = ShardedTable(args.path, val_fraction=args.val_fraction, seed=args.seed, source=str(args.path),
                             limits=ReadLimits(chunk_rows=args.chunk_rows))
        roles = _roles(args, table)
        fitted = fit_on_rank0(table, roles, torch.device("cpu"))
        fit_seconds = time.perf_counter() - started
        table.row_groups_read.clear()  # from here on: this rank's shard only
        data = RankInput(table, fitted, roles.target, rank=args.rank, world_size=args.world_size, seed=args.seed,
                         batch_size=args.batch_size, device=torch.device("cpu"))
        rows = steps = 0
        checksum = 0.0
        for x, y in data.batches(epoch=0):
            rows, steps, checksum = rows + len(y), steps + 1, checksum + float(x.sum())
        val_rows = sum(len(y) for _, y in data.validation())
    finally:
        dist.destroy_process_group()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_GIB
    print(json.dumps({"rows": rows, "seconds": round(seconds, 3), "peak_rss_gib": round(peak, 3),
                      "file_rows": table.num_rows, "rank": args.rank, "world_size": args.world_size, "steps": steps,
                      "val_rows": val_rows, "fit_seconds": round(fit_seconds, 3),
                      "row_groups_read": len(set(table.row_groups_read)), "chunk_rows": args.chunk_rows,
                      "checksum": checksum}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
