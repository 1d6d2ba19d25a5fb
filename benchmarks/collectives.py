"""Collectives on this machine against its ceilings and against a CPU-serialising RPC path, in one run:

    .venv/bin/python benchmarks/collectives.py [--nproc 2] [--max-bytes 256M] \
        [--out benchmarks/results/collectives.json]

1. ``training.collectives`` under torchrun (gloo on CPU, NCCL on GPUs): the nccl-tests table of all four ops.
2. Ceilings: memory copy GB/s (best of several 256 MiB tensor copies) and loopback TCP GB/s between two
   processes, one way (best of 3) and both ways at once (the two-way figure, per direction, is what a 2-rank ring
   all_reduce can reach: each rank sends and receives its whole buffer at the same time).
3. The share: ``--rounds`` rounds, each the two-way ceiling then the 64 MiB all_reduce (``training.collectives
   --preflight``), interleaved so that both see the same machine load; the share is the median of the rounds'
   busbw / ceiling, reported with its spread (min and max over rounds).
4. The same all_reduce through gRPC (generic bytes handlers; a server in rank 0's process sums the arrays it
   receives and answers every rank), at 4 KiB, 16 KiB, ... 64 MiB: the parameter-server path the seed compares
   collective libraries with. Every rank runs the same fixed number of rounds per size (``grpc_iterations``), so
   no rank moves on to the next size while another is still on the last; a rank that fails ends the benchmark at
   once with its error.

Prints and records: gloo all_reduce busbw at 64 MiB over the two-way TCP ceiling (median of the rounds, goal >=
0.8) and collective vs gRPC time ratio at 64 MiB (goal >= 5x) and at every size; writes a PNG of busbw against size.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
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
_GRPC_BYTES_PER_SIZE = 256 << 20


def run_collectives(nproc: int, out: Path, *args: str) -> dict:
    """``training.collectives`` on ``nproc`` local ranks with ``args``; its JSON."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training.collectives", *args, "--json", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def interleaved_share(nproc: int, rounds: int, tmp: Path) -> dict:
    """``rounds`` x (two-way TCP ceiling, then the 64 MiB all_reduce): per round busbw / ceiling; the median
    share and its spread. Alternating the two keeps a passing load from landing on one side only."""
    per_round = []
    for i in range(rounds):
        ceiling = loopback_tcp_gbps(256 << 20, both=True)
        key = run_collectives(nproc, tmp / f"preflight-{i}.json", "--preflight", "--warmup", "2", "--iters", "10",
                              "--budget-s", "1.0")
        row = key["results"][0]
        per_round.append({"ceiling_gbps": round(ceiling, 3), "busbw_gbps": round(row["busbw_gbps"], 3),
                          "share": round(row["busbw_gbps"] / ceiling, 3), "wrong": row["wrong"]})
    shares = [r["share"] for r in per_round]
    return {"rounds": per_round, "share_median": round(float(np.median(shares)), 3),
            "share_min": min(shares), "share_max": max(shares),
            "busbw_median_gbps": round(float(np.median([r["busbw_gbps"] for r in per_round])), 3),
            "ceiling_median_gbps": round(float(np.median([r["ceiling_gbps"] for r in per_round])), 3),
            "wrong": sum(r["wrong"] for r in per_round)}


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


def grpc_iterations(size_bytes: int) -> int:
    """Timed all_reduce rounds at ``size_bytes``: the same on every rank (3 to 10, about 256 MiB sent in all)."""
    return max(3, min(10, _GRPC_BYTES_PER_SIZE // size_bytes))


def _grpc_rank(rank: int, world_size: int, byte_sizes: list[int], port_queue, results) -> None:
    """One rank's rows, or its error, on ``results``: ``(rank, rows, None)`` or ``(rank, None, traceback)``."""
    try:
        results.put((rank, _grpc_rows(rank, world_size, byte_sizes, port_queue), None))
    except BaseException:  # the parent ends every rank with this text at once
        results.put((rank, None, traceback.format_exc()))
        raise


def _grpc_rows(rank: int, world_size: int, byte_sizes: list[int], port_queue) -> list[dict]:
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
            iters, start = grpc_iterations(size), time.perf_counter()
            for _ in range(iters):
                all_reduce(tensor)
            rows.append({"size_bytes": size, "time_us": (time.perf_counter() - start) / iters * 1e6, "wrong": wrong})
    if server:
        server.stop(grace=None)
    return rows


def grpc_all_reduce(world_size: int, byte_sizes: list[int]) -> list[dict]:
    """all_reduce of float32 arrays over gRPC on ``world_size`` processes; per size the mean time over ranks
    and the wrong values over ranks. Sizes run in lockstep (every rank sends each round)."""
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_grpc_rank, args=(r, world_size, byte_sizes, port_queue, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    per_rank: dict[int, list[dict]] = {}
    try:
        while len(per_rank) < world_size:
            try:
                rank, rows, error = results.get(timeout=1.0)
            except queue.Empty:  # no news: a rank that died without a word (killed, crashed) ends it too
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"gRPC rank {dead[0][0]} exited with {dead[0][1]} before reporting")
                continue
            if error:
                raise RuntimeError(f"gRPC rank {rank} failed:\n{error}")
            per_rank[rank] = rows
    finally:
        for p in procs:
            if p.is_alive() and len(per_rank) < world_size:
                p.terminate()
            p.join()
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
    parser.add_argument("--rounds", type=int, default=7, help="interleaved (ceiling, all_reduce) rounds for the share")
    args = parser.parse_args(argv)
    if args.max_bytes < KEY_BYTES:
        parser.error(f"--max-bytes must reach {KEY_BYTES >> 20}M, the size the goals are read at")
    if args.rounds < 1:
        parser.error("--rounds takes a whole number >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        coll = run_collectives(args.nproc, Path(tmp) / "collectives.json", "--max-bytes", str(args.max_bytes),
                               "--warmup", "2", "--iters", "10", "--budget-s", "1.0")
        shares = interleaved_share(args.nproc, args.rounds, Path(tmp))
    copy = memory_copy_gbps()
    one_way = max(loopback_tcp_gbps(512 << 20, both=False) for _ in range(3))  # a ceiling: best of 3
    grpc_rows = grpc_all_reduce(args.nproc, sizes(parse_bytes("4K"), KEY_BYTES)[::2])  # 4K, 16K, ... 64M

    all_reduce = {r["size_bytes"]: r for r in coll["results"] if r["op"] == "all_reduce"}
    ratios = {str(g["size_bytes"]): round(g["time_us"] / all_reduce[g["size_bytes"]]["time_us"], 2)
              for g in grpc_rows if g["size_bytes"] in all_reduce}
    share = shares["share_median"]
    two_way = shares["ceiling_median_gbps"]
    ratio = ratios[str(KEY_BYTES)]
    wrong = coll["wrong"] + shares["wrong"] + sum(g["wrong"] for g in grpc_rows)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
              "collectives": coll,
              "ceilings_gbps": {"memory_copy": round(copy, 3), "loopback_tcp_one_way": round(one_way, 3),
                                "loopback_tcp_two_way_per_direction": two_way},
              "share_rounds": shares,
              "grpc_all_reduce": grpc_rows,
              "all_reduce_64MiB": {"busbw_gbps": shares["busbw_median_gbps"], "share_of_two_way_tcp": share,
                                   "share_spread": [shares["share_min"], shares["share_max"]],
                                   "share_goal": SHARE_GOAL, "grpc_over_collective_time": ratio,
                                   "ratio_goal": RATIO_GOAL},
              "grpc_over_collective_time_by_size": ratios,
              "share_within_goal": share >= SHARE_GOAL, "ratio_within_goal": ratio >= RATIO_GOAL,
              "wrong": wrong, "correct": wrong == 0}

    print(f"\nceilings: memory copy {copy:.2f} GB/s, loopback TCP one way {one_way:.2f} GB/s, "
          f"both ways {two_way:.2f} GB/s per direction (median of {args.rounds} rounds)")
    print(f"\n{'round':>5} {'ceiling GB/s':>13} {'busbw GB/s':>11} {'share':>6}")
    for i, r in enumerate(shares["rounds"], 1):
        print(f"{i:>5} {r['ceiling_gbps']:>13.2f} {r['busbw_gbps']:>11.2f} {r['share']:>6.2f}")
    print(f"\n{'size (B)':>12} {coll['backend'] + ' us':>12} {'gRPC us':>12} {'gRPC/' + coll['backend']:>11}")
    for g in grpc_rows:
        print(f"{g['size_bytes']:>12} {all_reduce[g['size_bytes']]['time_us']:>12.1f} {g['time_us']:>12.1f} "
              f"{ratios[str(g['size_bytes'])]:>10.2f}x")
    print(f"\nall_reduce at 64 MiB: busbw {shares['busbw_median_gbps']:.2f} GB/s = {share:.2f} of the two-way TCP "
          f"ceiling (median of {args.rounds} interleaved rounds, spread {shares['share_min']:.2f}-"
          f"{shares['share_max']:.2f}; goal >= {SHARE_GOAL}); {ratio:.1f}x faster than gRPC (goal >= "
          f"{RATIO_GOAL:.0f}x); #wrong {wrong}")
    atomic_write_json(args.out, result)
    plot(coll["results"], grpc_rows, coll["world_size"], coll["backend"], args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
