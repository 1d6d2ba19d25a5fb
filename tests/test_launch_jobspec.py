"""The job spec (pod env, command) and its local rendering: real torchrun agents, 2 nodes x 2 processes; the free
ports below the ephemeral range that the master and local servers take."""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from training.launch.jobspec import JobSpec
from training.launch.local import LaunchError, free_port, free_ports, launch_local

# A stand-in for training.train: records its env and pids; then returns (env), waits (wait), dies without an error
# file on rank 1 (crash), or joins the process group and raises on rank 3 while the others wait (fail).
WORKER = '''
import json, os, signal, sys
from pathlib import Path

KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "PYTHONUNBUFFERED", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK", "PET_NNODES",
        "PET_NPROC_PER_NODE"]


def main():
    rank = int(os.environ["RANK"])
    info = {"pid": os.getpid(), "agent_pid": os.getppid(), "env": {k: os.environ.get(k) for k in KEYS}}
    Path(os.environ["KFLOOP_TEST_OUT"], f"rank-{rank}.json").write_text(json.dumps(info))
    if os.environ["KFLOOP_TEST_MODE"] == "env":
        return
    if os.environ["KFLOOP_TEST_MODE"] == "crash" and rank == 1:
        sys.stderr.write("fatal: cannot map shard 1\\n")
        sys.stderr.flush()
        os._exit(3)
    if os.environ["KFLOOP_TEST_MODE"] in ("wait", "crash"):
        os.write(1, f"READY {rank}\\n".encode())  # one write: the node's ranks share one pipe
        signal.pause()
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def work():
        dist.init_process_group("gloo")
        dist.barrier()
        if rank == 3:
            raise RuntimeError("rank 3 refuses: shard 3 is unreadable")
        signal.pause()

    work()


main()
'''

CALLER = '''
import json, sys
from pathlib import Path
from training.launch.jobspec import JobSpec
from training.launch.local import launch_local

launch_local(JobSpec(nnodes=2, nproc_per_node=2, module="kfloop_test_worker", env=json.loads(sys.argv[2])),
             log_dir=Path(sys.argv[1]), echo=True)
'''


def test_pod_env_is_the_training_operators():
    spec = JobSpec(name="churn", nnodes=3, nproc_per_node=4, args=["--x"], env={"A": "1"})
    assert spec.pod_env(2, "churn-master-0", 23456) == {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "churn-master-0",
        "PET_MASTER_ADDR": "churn-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": "12",
        "RANK": "2",
        "PET_NODE_RANK": "2",
        "PET_NPROC_PER_NODE": "4",
        "PET_NNODES": "3",
    }
    restarting = JobSpec(nnodes=2, nproc_per_node=1, max_restarts=3)
    assert restarting.pod_env(0, "m", 23456)["PET_MAX_RESTARTS"] == "3"
    with pytest.raises(ValueError, match="nodes 0..2"):
        spec.pod_env(3, "churn-master-0", 23456)


def test_command_leaves_the_topology_to_the_pet_env():
    spec = JobSpec(nnodes=2, nproc_per_node=2, args=["--data", "d.parquet"], rdzv_timeout_seconds=30)
    assert spec.command() == ["python", "-m", "torch.distributed.run", "--rdzv-conf=timeout=30",
                              "-m", "training.train", "--data", "d.parquet"]
    assert spec.command(python="/venv/bin/python")[0] == "/venv/bin/python"


@pytest.mark.parametrize("kwargs, message", [
    ({"env": {"MASTER_ADDR": "x"}}, "Training Operator sets"),
    ({"name": "Train_Job"}, "lowercase letters"),
    ({"nnodes": 0}, "nnodes=0"),
    ({"module": "training/train.py"}, "dotted Python module"),
    ({"max_restarts": -1}, "max_restarts=-1"),
])
def test_spec_rejects_what_a_pod_cannot_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**kwargs)


def _worker_spec(tmp_path: Path, mode: str) -> tuple[JobSpec, Path]:
    (tmp_path / "kfloop_test_worker.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PYTHONPATH": str(tmp_path), "KFLOOP_TEST_OUT": str(out), "KFLOOP_TEST_MODE": mode,
           "OMP_NUM_THREADS": "1"}
    return JobSpec(nnodes=2, nproc_per_node=2, module="kfloop_test_worker", env=env), out


def _ranks(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_local_nodes_get_the_pod_env_and_torchrun_derives_the_ranks(tmp_path):
    spec, out = _worker_spec(tmp_path, "env")
    result = launch_local(spec, log_dir=tmp_path / "logs")
    assert result.world_size == 4
    assert [p.name for p in result.logs] == ["node-0.log", "node-1.log"]
    ranks = _ranks(out)
    assert sorted(ranks) == [0, 1, 2, 3]
    ports = {r["env"]["MASTER_PORT"] for r in ranks.values()}
    assert len(ports) == 1
    for rank, info in ranks.items():
        env = info["env"]
        node = rank // 2
        assert env["GROUP_RANK"] == env["PET_NODE_RANK"] == str(node)
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "2" and env["PYTHONUNBUFFERED"] == "1"
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "localhost"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"]
    assert len({ranks[r]["agent_pid"] for r in (0, 2)}) == 2, "each node has its own agent"


def test_a_failing_rank_fails_the_launch_with_its_error_and_stops_every_process(tmp_path):
    spec, out = _worker_spec(tmp_path, "fail")
    with pytest.raises(LaunchError) as caught:
        launch_local(spec, log_dir=tmp_path / "logs")
    err = caught.value
    assert (err.rank, err.node, err.node_exit_code) == (3, 1, 1)
    assert "RuntimeError: rank 3 refuses: shard 3 is unreadable" in str(err)
    assert 'raise RuntimeError("rank 3 refuses' in str(err), "the traceback's last lines are quoted"
    assert str(tmp_path / "logs" / "node-1.log") in str(err)
    ranks = _ranks(out)
    assert sorted(ranks) == [0, 1, 2, 3]
    pids = {info["pid"] for info in ranks.values()} | {info["agent_pid"] for info in ranks.values()}
    assert [pid for pid in pids if _alive(pid)] == []


def test_a_rank_dying_without_an_error_file_is_named_with_its_stderr(tmp_path):
    spec, out = _worker_spec(tmp_path, "crash")
    with pytest.raises(LaunchError) as caught:
        launch_local(spec, log_dir=tmp_path / "logs")
    err = caught.value
    assert (err.rank, err.node) == (1, 0)
    assert "fatal: cannot map shard 1" in str(err)
    pids = {info["pid"] for info in _ranks(out).values()} | {info["agent_pid"] for info in _ranks(out).values()}
    assert [pid for pid in pids if _alive(pid)] == []


def test_sigterm_to_the_caller_stops_every_node(tmp_path):
    spec, out = _worker_spec(tmp_path, "wait")
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path / "logs"), json.dumps(spec.env)],
                              stdout=subprocess.PIPE, cwd=Path(__file__).parents[1])
    try:
        output, deadline = b"", time.monotonic() + 120
        while output.count(b"READY") < 4:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and select.select([caller.stdout], [], [], remaining)[0], output
            chunk = os.read(caller.stdout.fileno(), 4096)
            assert chunk, f"the launch ended before every rank was ready: {output!r}"
            output += chunk
        ranks = _ranks(out)
        pids = {info["pid"] for info in ranks.values()} | {info["agent_pid"] for info in ranks.values()}
        assert len(pids) == 6 and all(_alive(pid) for pid in pids)
        os.kill(caller.pid, signal.SIGTERM)
        assert caller.wait(timeout=60) == 128 + signal.SIGTERM
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        if caller.poll() is None:
            caller.terminate()
            caller.wait(timeout=60)
        caller.stdout.close()


def test_free_ports_are_distinct_below_the_ephemeral_range_and_all_bindable_at_once():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [*free_ports(3), free_port()]
    assert len(set(ports[:3])) == 3
    assert all(low // 2 <= port < low for port in ports)
    with ExitStack() as bound:
        for port in ports[:3]:
            bound.enter_context(socket.create_server(("127.0.0.1", port)))
