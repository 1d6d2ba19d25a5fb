"""Collective bandwidth of a torchrun job, measured like nccl-tests (gloo on CPU, NCCL on GPUs):

    torchrun --nproc-per-node N -m training.collectives [--ops all_reduce ...] [--min-bytes 1K] [--max-bytes 256M]
                                                        [--json FILE] [--preflight --min-busbw-gbps F]

For every op and size (doubling from ``--min-bytes`` to ``--max-bytes``): warm-up, then timed iterations; time is
the mean over ranks of one iteration; algbw = size / time; busbw = algbw x nccl-tests' factor (all_reduce
2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1), comparable with the link's bandwidth whatever n is.
``size`` is the bytes of the full buffer (all_gather: the gathered output, reduce_scatter: the input). ``#wrong``
counts elements that differ from the expected values in a separate, checked run. Rank 0 prints the table and
writes JSON. ``--preflight`` times all_reduce at 64 MiB only and exits 1 on every rank when busbw is below
``--min-busbw-gbps`` or a value is wrong: run it as a short job before trusting a cluster with training.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from data.fileio import atomic_write_json
from training.devices import pin_local_device

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PREFLIGHT_BYTES = 64 << 20
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(kw_only=True, slots=True, frozen=True)
class Measurement:
    """One row of the table."""

    op: str
    """Collective name, one of ``OPS``."""
    size_bytes: int
    """Bytes of the full buffer (nccl-tests' ``size``)."""
    count: int
    """Elements of the full buffer."""
    dtype: str
    """Element type."""
    time_us: float
    """Mean over ranks of the mean time of one timed iteration, microseconds."""
    algbw_gbps: float
    """``size_bytes / time``, GB/s (1e9 bytes)."""
    busbw_gbps: float
    """``algbw`` times the op's bus factor, GB/s."""
    wrong: int
    """Elements, over all ranks, that differ from the expected result."""


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algbw to busbw: the share of the data each rank's link carries."""
    n = world_size
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "broadcast": 1.0}[op]


def parse_bytes(text: str) -> int:
    """``"1K"``, ``"64M"``, ``"256M"``, ``"4096"`` -> bytes (binary units).

    Raises:
        ValueError: not a positive whole number with an optional K, M or G suffix.
    """
    unit = text[-1:].upper() if text[-1:].upper() in _UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit() or int(number) < 1:
        raise ValueError(f"size {text!r}: use a positive whole number of bytes with an optional K, M or G, e.g. 64M")
    return int(number) * _UNITS[unit]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Doubling sizes from ``min_bytes`` to ``max_bytes`` inclusive."""
    out = [min_bytes]
    while out[-1] * 2 <= max_bytes:
        out.append(out[-1] * 2)
    return out


class _Buffers:
    """Input and output of one op at one size, filled so that the result is known: rank r's element i is
    ``r + 1 + i % 7`` (small integers, exact in float32 and bf16 sums)."""

    def __init__(self, op: str, size_bytes: int, dtype: torch.dtype, device: torch.device):
        self.op, self.n, self.rank = op, dist.get_world_size(), dist.get_rank()
        element = torch.tensor([], dtype=dtype).element_size()
        self.count = max(self.n, size_bytes // element // self.n * self.n)  # divisible by the world size
        per_rank = self.count // self.n
        full = torch.empty(self.count, dtype=dtype, device=device)
        part = torch.empty(per_rank, dtype=dtype, device=device)
        self.input, self.output = {"all_reduce": (full, full), "all_gather": (part, full),
                                   "reduce_scatter": (full, part), "broadcast": (full, full)}[op]

    def run(self) -> None:
        match self.op:
            case "all_reduce":
                dist.all_reduce(self.output)
            case "all_gather":
                dist.all_gather_into_tensor(self.output, self.input)
            case "reduce_scatter":
                dist.reduce_scatter_tensor(self.output, self.input)
            case "broadcast":
                dist.broadcast(self.output, src=0)

    def fill(self) -> None:
        """The known input (broadcast: only on the root, zeros elsewhere)."""
        self.input.copy_(self._pattern(len(self.input), self.rank))
        if self.op == "broadcast" and self.rank != 0:
            self.input.zero_()

    def wrong(self) -> int:
        """Elements of this rank's output that differ from the expected result."""
        out = self.output.float()
        length = len(out)
        match self.op:
            case "all_reduce":
                expected = sum(self._pattern(length, r) for r in range(self.n))
            case "all_gather":
                per_rank = length // self.n
                expected = torch.cat([self._pattern(per_rank, r) for r in range(self.n)])
            case "reduce_scatter":
                start = self.rank * length
                expected = sum(self._pattern(self.count, r)[start:start + length] for r in range(self.n))
            case _:
                expected = self._pattern(length, 0)
        return int((out != expected).sum())

    def _pattern(self, length: int, rank: int) -> torch.Tensor:
        return (torch.arange(length, device=self.output.device) % 7 + rank + 1).float()


def measure(op: str, size_bytes: int, *, dtype: torch.dtype, device: torch.device, warmup: int, iters: int,
            budget_s: float) -> Measurement:
    """Time ``op`` at ``size_bytes``: ``warmup`` runs, then up to ``iters`` timed ones (fewer when they would
    take longer than ``budget_s``; all ranks run the same number), then one checked run."""
    buffers = _Buffers(op, size_bytes, dtype, device)
    buffers.input.zero_()
    started = time.perf_counter()
    for _ in range(warmup):
        buffers.run()
    _sync(device)
    per_run = torch.tensor([(time.perf_counter() - started) / max(warmup, 1)], dtype=torch.float64, device=device)
    dist.all_reduce(per_run, op=dist.ReduceOp.MAX)
    timed = max(1, min(iters, int(budget_s / max(float(per_run), 1e-9))))
    dist.barrier()
    started = time.perf_counter()
    for _ in range(timed):
        buffers.run()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - started) / timed], dtype=torch.float64, device=device)
    buffers.fill()
    buffers.run()
    _sync(device)
    wrong = torch.tensor([buffers.wrong()], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed)
    dist.all_reduce(wrong)
    seconds = float(elapsed) / dist.get_world_size()
    size = buffers.count * buffers.input.element_size()
    algbw = size / seconds / 1e9
    return Measurement(op=op, size_bytes=size, count=buffers.count, dtype=str(dtype).removeprefix("torch."),
                       time_us=seconds * 1e6, algbw_gbps=algbw,
                       busbw_gbps=algbw * bus_factor(op, dist.get_world_size()), wrong=int(wrong))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def table(rows: list[Measurement]) -> str:
    """nccl-tests-style table, one block per op."""
    lines = []
    for op in dict.fromkeys(r.op for r in rows):
        lines += [f"# {op}", f"#{'size':>12} {'count':>12} {'type':>8} {'time':>10} {'algbw':>8} {'busbw':>8} "
                  f"{'#wrong':>6}", f"#{'(B)':>12} {'(elements)':>12} {'':>8} {'(us)':>10} {'(GB/s)':>8} "
                  f"{'(GB/s)':>8}"]
        lines += [f" {r.size_bytes:>12} {r.count:>12} {r.dtype:>8} {r.time_us:>10.1f} {r.algbw_gbps:>8.3f} "
                  f"{r.busbw_gbps:>8.3f} {r.wrong:>6}" for r in rows if r.op == op]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m training.collectives", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("1K"), help="smallest size, e.g. 1K")
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("256M"), help="largest size, e.g. 256M")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per size")
    parser.add_argument("--iters", type=int, default=20, help="most timed runs per size")
    parser.add_argument("--budget-s", type=float, default=2.0, help="fewer timed runs when they would take longer")
    parser.add_argument("--json", type=Path, help="rank 0 writes the results here")
    parser.add_argument("--preflight", action="store_true",
                        help="all_reduce at 64 MiB only; exit 1 below --min-busbw-gbps or on a wrong value")
    parser.add_argument("--min-busbw-gbps", type=float, default=0.0, help="preflight floor for all_reduce busbw")
    args = parser.parse_args(argv)
    if args.min_bytes > args.max_bytes:
        parser.error(f"--min-bytes {args.min_bytes} is above --max-bytes {args.max_bytes}; swap them")
    if args.warmup < 0 or args.iters < 1 or args.budget_s <= 0:
        parser.error("use --warmup >= 0, --iters >= 1 and --budget-s > 0")
    if args.min_busbw_gbps < 0 or (args.min_busbw_gbps and not args.preflight):
        parser.error("--min-busbw-gbps takes a number >= 0 and needs --preflight")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, print and write on rank 0; returns the exit status (1: a wrong value or a failed preflight)."""
    args = parse_args(argv)
    index = pin_local_device()  # before CUDA initialises: a MIG device per local rank
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", index) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "LOCAL_RANK" in os.environ:  # launched by torchrun (the operators' pod env sets no LOCAL_RANK)
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    else:
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ops, byte_sizes = (["all_reduce"], [PREFLIGHT_BYTES]) if args.preflight else (args.ops, sizes(
            args.min_bytes, args.max_bytes))
        rows = [measure(op, size, dtype=getattr(torch, args.dtype), device=device, warmup=args.warmup,
                        iters=args.iters, budget_s=args.budget_s) for op in ops for size in byte_sizes]
        backend, world = dist.get_backend(), dist.get_world_size()
    finally:
        dist.destroy_process_group()
    wrong = sum(r.wrong for r in rows)
    failure = _failure(rows, args.min_busbw_gbps, backend, world) if args.preflight else None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"# {backend}, {world} ranks, {args.dtype}\n{table(rows)}\n# #wrong total: {wrong}", flush=True)
        if args.json:
            atomic_write_json(args.json, {"backend": backend, "world_size": world, "dtype": args.dtype,
                                          "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                                          "results": [asdict(r) for r in rows], "wrong": wrong,
                                          "correct": wrong == 0, "preflight": failure if args.preflight else None})
        if args.preflight:
            print(failure or f"preflight passed: all_reduce busbw {rows[0].busbw_gbps:.2f} GB/s >= required "
                             f"{args.min_busbw_gbps:.2f} GB/s", file=sys.stderr if failure else sys.stdout)
    return 1 if wrong or failure else 0


def _failure(rows: list[Measurement], floor: float, backend: str, world: int) -> str | None:
    row = rows[0]
    if row.wrong:
        return f"preflight failed: all_reduce returned {row.wrong} wrong values over {world} ranks ({backend})"
    if row.busbw_gbps < floor:
        return (f"preflight failed: all_reduce busbw {row.busbw_gbps:.2f} GB/s at {row.size_bytes >> 20} MiB over "
                f"{world} ranks ({backend}) is below the required {floor:.2f} GB/s; check the interconnect "
                "(NCCL_DEBUG=INFO shows the transport NCCL chose) before training")
    return None


if __name__ == "__main__":
    sys.exit(main())
