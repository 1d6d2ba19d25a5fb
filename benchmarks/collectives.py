"""Collectives on this machine against its ceilings and against a CPU-serialising RPC path, in one run:

    .venv/bin/python benchmarks/collectives.py [--nproc 2] [--max-bytes 256M] \
        [--out benchmarks/results/collectives.json]

1. ``training.collectives`` under torchrun (gloo on CPU, NCCL on GPUs): the nccl-tests table of all four ops.
2. Ceilings (best of several): memory copy GB/s (a 256 MiB tensor copy) and loopback TCP GB/s between two
   processes, one way and both ways at once (the two-way figure, per direction, is what a 2-rank ring all_reduce
   can reach: each rank sends and receives its whole buffer at the same time).
3. The same all_reduce through gRPC (generic bytes handlers; a server in rank 0's process sums the arrays it
   receives and answers every rank), at 4 KiB, 16 KiB, ... 64 MiB: the parameter-server path the seed compares
   collective libraries with.

Prints and records: gloo all_reduce busbw at 64 MiB over the two-way TCP ceiling (goal >= 0.8) and collective
vs gRPC time ratio at 64 MiB (goal >= 5x) and at every size; writes a PNG of busbw against size.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import torch

from data.fileio import atomic_write_json
from training.collectives import OPS, parse_bytes, sizes

SHARE_GOAL = 0.8
RATIO_GOAL = 5.0
KEY_BYTES = 64 << 20
_METHOD = "/kfloop.bench.Reduce/AllReduce"
_CHUNK = 1 << 20


def run_collectives(nproc: int, max_bytes: int, out: Path) -> dict:
    """``training.collectives`` on ``nproc`` local ranks; its JSON."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training.collectives", "--max-bytes", str(max_bytes), "--warmup", "2", "--iters", "10",
           "--budget-s", "1.0", "--json", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def memory_copy_gbps(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best of ``repeats`` single-thread copies of one tensor into another: bytes copied per second."""
    torch.set_num_threads(1)
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    assert torch.equal(src, dst)
    return nbytes / best / 1e9


def _send(sock: socket.socket, nbytes: int) -> None:
    block = memoryview(bytes(_CHUNK))
    sent = 0
    while sent < nbytes:
        sock.sendall(block[:min(_CHUNK, nbytes - sent)])
        sent += min(_CHUNK, nbytes - sent)


def _receive(sock: socket.socket, nbytes: int) -> None:
    block = memoryview(bytearray(_CHUNK))
    got = 0
    while got < nbytes:
        n = sock.recv_into(block, min(_CHUNK, nbytes - got))
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {nbytes} bytes")
        got += n


def _transfer(sock: socket.socket, nbytes: int, *, main, both: bool) -> None:
    """``main(sock, nbytes)``; with ``both``, the opposite direction at the same time in a thread."""
    other = threading.Thread(target=_receive if main is _send else _send, args=(sock, nbytes)) if both else None
    if other:
        other.start()
    main(sock, nbytes)
    if other:
        other.join()


def _tcp_peer(port: int, nbytes: int, both: bool) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        _transfer(sock, nbytes, main=_receive, both=both)
        sock.sendall(b"k")


def loopback_tcp_gbps(nbytes: int, *, both: bool) -> float:
    """Bytes per second one way over a loopback TCP connection to another process; with ``both`` the two
    processes send to each other at the same time and the figure is per direction."""
    ctx = mp.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = ctx.Process(target=_tcp_peer, args=(server.getsockname()[1], nbytes, both))
        peer.start()
        conn, _ = server.accept()
        with conn:
            start = time.perf_counter()
            _transfer(conn, nbytes, main=_send, both=both)
            if conn.recv(1) != b"k":
                raise ConnectionError("peer did not confirm")
            seconds = time.perf_counter() - start
        peer.join()
    if peer.exitcode:
        raise RuntimeError(f"loopback peer exited with {peer.exitcode}")
    return nbytes / seconds / 1e9


class _Summer:
    """gRPC handler: waits for every rank's array of a round, answers each with their sum."""

    def __init__(self, world_size: int):
        self.world_size, self.round, self.arrived = world_size, 0, 0
        self.total: np.ndarray | None = None
        self.result = b""
        self.cond = threading.Condition()

    def __call__(self, request: bytes, context) -> bytes:
        values = np.frombuffer(request, dtype=np.float32)
        with self.cond:
            mine = self.round
            self.total = values.copy() if self.total is None else self.total + values
            self.arrived += 1
            if self.arrived == self.world_size:
                self.result, self.total, self.arrived = self.total.tobytes(), None, 0
                self.round += 1
                self.cond.notify_all()
            else:
                self.cond.wait_for(lambda: self.round != mine)
            return self.result


def _grpc_rank(rank: int, world_size: int, byte_sizes: list[int], port_queue, results) -> None:
    import grpc

    torch.set_num_threads(1)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    server = None
    if rank == 0:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=world_size + 2), options=options)
        handler = grpc.unary_unary_rpc_method_handler(_Summer(world_size))
        service, method = _METHOD.strip("/").split("/")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        for _ in range(world_size - 1):
            port_queue.put(port)
    else:
        port = port_queue.get()
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary(_METHOD)
        rows = []
        for size in byte_sizes:
            tensor = (torch.arange(size // 4) % 7 + rank + 1).float()
            expected = sum((torch.arange(size // 4) % 7 + r + 1).float() for r in range(world_size))

            def all_reduce(t: torch.Tensor) -> torch.Tensor:  # serialise, send, wait, deserialise
                return torch.from_numpy(np.frombuffer(call(t.numpy().tobytes()), dtype=np.float32).copy())

            wrong = int((all_reduce(tensor) != expected).sum())  # also the warm-up
            iters, start = 0, time.perf_counter()
            while iters < 3 or (iters < 10 and time.perf_counter() - start < 1.0):
                all_reduce(tensor)
                iters += 1
            rows.append({"size_bytes": size, "time_us": (time.perf_counter() - start) / iters * 1e6, "wrong": wrong})
    results.put((rank, rows))
    if server:
        server.stop(grace=None)


def grpc_all_reduce(world_size: int, byte_sizes: list[int]) -> list[dict]:
    """all_reduce of float32 arrays over gRPC on ``world_size`` processes; per size the mean time over ranks
    and the wrong values over ranks. Sizes run in lockstep (every rank sends each round)."""
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_grpc_rank, args=(r, world_size, byte_sizes, port_queue, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    per_rank = dict(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"gRPC rank exited with {p.exitcode}")
    return [{"size_bytes": size, "time_us": float(np.mean([per_rank[r][i]["time_us"] for r in per_rank])),
             "wrong": sum(per_rank[r][i]["wrong"] for r in per_rank)} for i, size in enumerate(byte_sizes)]


def plot(results: list[dict], grpc_rows: list[dict], world_size: int, backend: str, path: Path) -> None:
    """busbw against size, one line per op and one for the gRPC all_reduce."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.collectives import bus_factor

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in OPS:
        rows = [r for r in results if r["op"] == op]
        ax.plot([r["size_bytes"] for r in rows], [r["busbw_gbps"] for r in rows], marker=".", label=f"{backend} {op}")
    factor = bus_factor("all_reduce", world_size)
    ax.plot([r["size_bytes"] for r in grpc_rows], [r["size_bytes"] / r["time_us"] / 1e3 * factor for r in grpc_rows],
            marker="x", linestyle="--", label="gRPC all_reduce")
    ax.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)",
           title=f"busbw vs size, {world_size} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as tmp:
        fig.savefig(tmp.name, dpi=110)
    os.replace(tmp.name, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="local ranks (and gRPC processes)")
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("256M"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/collectives.json"))
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/results/collectives.png"))
    args = parser.parse_args(argv)
    if args.max_bytes < KEY_BYTES:
        parser.error(f"--max-bytes must reach {KEY_BYTES >> 20}M, the size the goals are read at")

    with tempfile.TemporaryDirectory() as tmp:
        coll = run_collectives(args.nproc, args.max_bytes, Path(tmp) / "collectives.json")
    copy = memory_copy_gbps()
    one_way = max(loopback_tcp_gbps(512 << 20, both=False) for _ in range(3))  # a ceiling: best of 3
    two_way = max(loopback_tcp_gbps(256 << 20, both=True) for _ in range(3))
    grpc_rows = grpc_all_reduce(args.nproc, sizes(parse_bytes("4K"), KEY_BYTES)[::2])  # 4K, 16K, ... 64M

    all_reduce = {r["size_bytes"]: r for r in coll["results"] if r["op"] == "all_reduce"}
    ratios = {str(g["size_bytes"]): round(g["time_us"] / all_reduce[g["size_bytes"]]["time_us"], 2)
              for g in grpc_rows if g["size_bytes"] in all_reduce}
    key = all_reduce[KEY_BYTES]
    share = key["busbw_gbps"] / two_way
    ratio = ratios[str(KEY_BYTES)]
    wrong = coll["wrong"] + sum(g["wrong"] for g in grpc_rows)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
              "collectives": coll,
              "ceilings_gbps": {"memory_copy": round(copy, 3), "loopback_tcp_one_way": round(one_way, 3),
                                "loopback_tcp_two_way_per_direction": round(two_way, 3)},
              "grpc_all_reduce": grpc_rows,
              "all_reduce_64MiB": {"busbw_gbps": round(key["busbw_gbps"], 3), "share_of_two_way_tcp": round(share, 3),
                                   "share_goal": SHARE_GOAL, "grpc_over_collective_time": ratio,
                                   "ratio_goal": RATIO_GOAL},
              "grpc_over_collective_time_by_size": ratios,
              "share_within_goal": share >= SHARE_GOAL, "ratio_within_goal": ratio >= RATIO_GOAL,
              "wrong": wrong, "correct": wrong == 0}

    print(f"\nceilings: memory copy {copy:.2f} GB/s, loopback TCP one way {one_way:.2f} GB/s, "
          f"both ways {two_way:.2f} GB/s per direction")
    print(f"\n{'size (B)':>12} {coll['backend'] + ' us':>12} {'gRPC us':>12} {'gRPC/' + coll['backend']:>11}")
    for g in grpc_rows:
        print(f"{g['size_bytes']:>12} {all_reduce[g['size_bytes']]['time_us']:>12.1f} {g['time_us']:>12.1f} "
              f"{ratios[str(g['size_bytes'])]:>10.2f}x")
    print(f"\nall_reduce at 64 MiB: busbw {key['busbw_gbps']:.2f} GB/s = {share:.2f} of the two-way TCP ceiling "
          f"(goal >= {SHARE_GOAL}); {ratio:.1f}x faster than gRPC (goal >= {RATIO_GOAL:.0f}x); #wrong {wrong}")
    atomic_write_json(args.out, result)
    plot(coll["results"], grpc_rows, coll["world_size"], coll["backend"], args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
