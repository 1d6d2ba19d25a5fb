"""training.collectives under real torchrun (gloo): table, JSON, correctness count and the preflight's exit."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from training.collectives import OPS, _Buffers, bus_factor, parse_bytes, sizes


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training.collectives", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_every_op_and_size_is_measured_and_correct(tmp_path):
    out = tmp_path / "c.json"
    run = torchrun("--max-bytes", "8K", "--warmup", "1", "--iters", "2", "--json", str(out), nproc=3)

    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert (result["backend"], result["world_size"], result["wrong"], result["correct"]) == ("gloo", 3, 0, True)
    rows = result["results"]
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in OPS for s in (1020, 2040, 4092, 8184)]
    for r in rows:
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["op"], 3))
    assert "# reduce_scatter" in run.stdout and "#wrong total: 0" in run.stdout


def test_preflight_below_the_floor_fails_naming_measured_and_required(tmp_path):
    out = tmp_path / "p.json"
    run = torchrun("--preflight", "--min-busbw-gbps", "100000", "--warmup", "1", "--iters", "1", "--json", str(out))

    assert run.returncode != 0
    measured = json.loads(out.read_text())["results"][0]
    assert measured["op"] == "all_reduce" and measured["size_bytes"] == 64 << 20 and measured["wrong"] == 0
    assert f"busbw {measured['busbw_gbps']:.2f} GB/s" in run.stderr
    assert "below the required 100000.00 GB/s" in run.stderr


def test_preflight_above_the_floor_passes():
    run = torchrun("--preflight", "--min-busbw-gbps", "0.0001", "--warmup", "1", "--iters", "1")

    assert run.returncode == 0, run.stderr
    assert "preflight passed: all_reduce busbw" in run.stdout


@pytest.mark.parametrize("op", OPS)
def test_wrong_values_are_counted(op):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        buffers = _Buffers(op, 4096, torch.float32, torch.device("cpu"))
        buffers.fill()
        buffers.run()
        assert buffers.wrong() == 0
        buffers.output[[3, 100]] += 1
        assert buffers.wrong() == 2
    finally:
        dist.destroy_process_group()


def test_sizes_factors_and_size_parsing():
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert [bus_factor(op, 4) for op in OPS] == [1.5, 0.75, 0.75, 1.0]
    assert (parse_bytes("1K"), parse_bytes("256M"), parse_bytes("4096")) == (1024, 256 << 20, 4096)
    with pytest.raises(ValueError, match="size '12X'"):
        parse_bytes("12X")
