"""GPU sharing that works (issue 16 part 4): a MIG device per local rank, shared GPU slices one rank per node, the
Guaranteed-QoS claim of ``numa_aligned``, and RDMA's IPC_LOCK as the one exception to the restricted profile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
from cluster import pod_security
from cluster.crd_schema import validate
from manifest_checks import pods

from training.devices import mig_device, pin_local_device
from training.launch.cluster import ClusterConfig
from training.launch.jobspec import JobSpec
from training.launch.manifests import render_pytorchjob

MIGS = "MIG-4f1c2a9e-0000-5000-8000-000000000001,MIG-4f1c2a9e-0000-5000-8000-000000000002"


def test_each_local_rank_gets_its_own_mig_device():
    first, second = MIGS.split(",")
    assert [mig_device(r, 2, MIGS) for r in (0, 1)] == [first, second]
    assert mig_device(0, 1, f" {first} ") == first
    for whole in ("GPU-8a1b", "all", "", "void"):
        assert mig_device(1, 2, whole) is None  # whole GPUs: cuda:<LOCAL_RANK> as before
    with pytest.raises(ValueError, match=r"3 processes on this node but NVIDIA_VISIBLE_DEVICES lists 2 MIG device"
                                         r".*set nproc_per_node=2, or cluster.mig_devices_per_node=3"):
        mig_device(2, 3, MIGS)


def test_pinning_sets_cuda_visible_devices_and_the_index_is_then_zero():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NVIDIA_VISIBLE_DEVICES": MIGS}
    assert pin_local_device(env) == 0 and env["CUDA_VISIBLE_DEVICES"] == MIGS.split(",")[1]
    whole = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert pin_local_device(whole) == 1 and "CUDA_VISIBLE_DEVICES" not in whole


_PROBE = """
import json, os, sys
import torch.distributed as dist
from training.config import TrainingConfig
from training.train import _init_distributed
me = _init_distributed(TrainingConfig(device="cpu"))
with open(os.path.join(sys.argv[1], f"rank-{me.rank}.json"), "w") as out:
    json.dump({"local_rank": os.environ["LOCAL_RANK"], "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}, out)
dist.destroy_process_group()
"""


def _torchrun(tmp_path, visible: str) -> subprocess.CompletedProcess:
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NVIDIA_VISIBLE_DEVICES": visible}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(probe), str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)


def test_ranks_spawned_by_torchrun_see_their_own_mig_device(tmp_path):
    """train.py's process-group setup pins the device before CUDA could initialise, in every spawned rank."""
    run = _torchrun(tmp_path, MIGS)
    assert run.returncode == 0, run.stderr
    seen = sorted(json.loads(p.read_text()).items() for p in tmp_path.glob("rank-*.json"))
    assert [dict(s) for s in seen] == [{"local_rank": "0", "visible": MIGS.split(",")[0]},
                                       {"local_rank": "1", "visible": MIGS.split(",")[1]}]


def test_too_few_mig_devices_fail_every_rank_clearly(tmp_path):
    run = _torchrun(tmp_path, MIGS.split(",")[0])
    assert run.returncode != 0
    assert "2 processes on this node but NVIDIA_VISIBLE_DEVICES lists 1 MIG device" in run.stderr
    assert not list(tmp_path.glob("rank-*.json"))


def test_shared_gpu_slices_run_one_rank_per_node():
    shared = ClusterConfig(shared_gpu_resource="nvidia.com/gpu.shared", shared_gpu_slices_per_node=4)
    with pytest.raises(ValueError, match=r"nproc_per_node=2 with shared_gpu_resource='nvidia.com/gpu.shared'.*"
                                         r"shares of one physical GPU.*Duplicate GPU detected.*nproc_per_node: 1"):
        render_pytorchjob(JobSpec(nnodes=2, nproc_per_node=2), shared)
    body = render_pytorchjob(JobSpec(nnodes=2, nproc_per_node=1), shared)
    resources = pods(body)["Worker"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu.shared"] == resources["limits"]["nvidia.com/gpu.shared"] == 4


def test_numa_aligned_claims_guaranteed_qos_only_where_the_operator_adds_no_init_container():
    numa = ClusterConfig(numa_aligned=True, cpu="8", memory="32Gi", gpus_per_node=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        single = render_pytorchjob(JobSpec(nnodes=1, nproc_per_node=8), numa)  # a Master alone: Guaranteed
    resources = pods(single)["Master"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    with pytest.warns(UserWarning, match=r"init-pytorch \(requests 50m/10Mi, limits 100m/20Mi\) to every Worker pod, "
                                         r"which makes them Burstable"):
        render_pytorchjob(JobSpec(nnodes=2, nproc_per_node=8), numa)


def test_rdma_adds_the_device_and_ipc_lock_the_one_exception_to_restricted():
    rdma = ClusterConfig(gpus_per_node=8, rdma_resource="rdma/rdma_shared_device_a", nccl_ib_hca="mlx5_0")
    body = render_pytorchjob(JobSpec(nnodes=2, nproc_per_node=8), rdma)
    assert validate(body) == []
    for pod in pods(body).values():
        (container,) = pod["containers"]
        resources = container["resources"]
        assert resources["requests"]["rdma/rdma_shared_device_a"] == resources["limits"][
            "rdma/rdma_shared_device_a"] == 1
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        # the real admission's verdict: restricted and baseline refuse it, privileged admits it
        assert pod_security.violations("restricted", pod) == [
            'unrestricted capabilities (container "pytorch" must not include "IPC_LOCK" in '
            'securityContext.capabilities.add)']
        assert len(pod_security.violations("baseline", pod)) == 1
        assert pod_security.violations("privileged", pod) == []
    plain = render_pytorchjob(JobSpec(nnodes=2, nproc_per_node=8), ClusterConfig(gpus_per_node=8))
    assert pod_security.violations("restricted", pods(plain)["Worker"]) == []


@pytest.mark.parametrize("settings, fix", [
    ({"rdma_resource": "rdma/rdma_shared_device_a"}, "set gpus_per_node"),
    ({"gpus_per_node": 1, "rdma_resource": "rdma/hca", "nccl_ib_disable": True}, "drop one"),
    ({"gpus_per_node": 1, "rdma_resource": "rdma"}, "extended resource name"),
    ({"gpus_per_node": 1, "rdma_resource": "rdma/hca", "rdma_devices_per_node": 0}, ">= 1 with rdma_resource"),
])
def test_rdma_settings_that_cannot_work_say_the_fix(settings, fix):
    with pytest.raises(ValueError, match=fix):
        ClusterConfig.from_dict(settings)
