"""The test cluster's scheduler: kube-scheduler's NodeResourcesFit filter (``cluster.k8s_operator.fits_request``)
against the cases of upstream's own ``pkg/scheduler/framework/plugins/noderesources/fit_test.go``
(``TestEnoughRequests``, ``TestNotEnoughRequests``, ``TestStorageRequests``; kubernetes at commit 24fbb13), and the
FailedScheduling message it gives."""
from __future__ import annotations

import pytest
from cluster.k8s_operator import fits_request, unschedulable_message

EXT_A, EXT_B = "example.com/aaa", "example.com/bbb"
K8S_IO_A, K8S_IO_B = "kubernetes.io/something", "subdomain.kubernetes.io/something"
HUGE_A = "hugepages-2Mi"
NODE = {"cpu": 0.010, "memory": 20, "pods": 32, EXT_A: 5, "ephemeral-storage": 20, HUGE_A: 5}
"""``makeAllocatableResources(10, 20, 32, 5, 20, 5)``: 10 millicores, 20 bytes, 32 pods, 5 of each scalar."""
ONE_POD_NODE = {"cpu": 0.010, "memory": 20, "pods": 1}
"""``TestNotEnoughRequests``' node: ``makeAllocatableResources(10, 20, 1, 0, 0, 0)``."""


def res(cpu_m: int = 0, memory: int = 0, storage: int = 0) -> dict:
    """``framework.Resource`` as ``newResourcePod`` turns it into a container's requests (cpu, memory, pods and
    ephemeral-storage always present, zero or not)."""
    requests = {"cpu": f"{cpu_m}m", "memory": str(memory), "pods": "0", "ephemeral-storage": str(storage)}
    return {"resources": {"requests": requests}}


def pod(*containers: dict, init: tuple[dict, ...] = ()) -> dict:
    """``newResourcePod(containers...)``, with ``newResourceInitPod``'s init containers."""
    return {"spec": {"containers": list(containers), "initContainers": list(init)}}



def ext(name: str, value: int, cpu_m: int = 0, memory: int = 0) -> dict:
    """``res`` with ``value`` of the scalar resource ``name`` besides."""
    container = res(cpu_m, memory)
    container["resources"]["requests"][name] = str(value)
    return container


EMPTY_POD = {"spec": {"containers": []}}

# (name, pod, the pod already on the node, allocatable, the reasons fitsRequest gives)
VECTORS = [
    ("no resources requested always fits", EMPTY_POD, pod(res(10, 20)), NODE, []),
    ("too many resources fails", pod(res(1, 1)), pod(res(10, 20)), NODE, ["Insufficient cpu", "Insufficient memory"]),
    ("too many resources fails due to init container cpu", pod(res(1, 1), init=(res(3, 1),)), pod(res(8, 19)), NODE,
     ["Insufficient cpu"]),
    ("too many resources fails due to highest init container cpu", pod(res(1, 1), init=(res(3, 1), res(2, 1))),
     pod(res(8, 19)), NODE, ["Insufficient cpu"]),
    ("too many resources fails due to init container memory", pod(res(1, 1), init=(res(1, 3),)), pod(res(9, 19)),
     NODE, ["Insufficient memory"]),
    ("too many resources fails due to highest init container memory", pod(res(1, 1), init=(res(1, 3), res(1, 2))),
     pod(res(9, 19)), NODE, ["Insufficient memory"]),
    ("init container fits because it's the max, not sum, of containers and init containers",
     pod(res(1, 1), init=(res(1, 1),)), pod(res(9, 19)), NODE, []),
    ("multiple init containers fit because it's the max, not sum, of containers and init containers",
     pod(res(1, 1), init=(res(1, 1), res(1, 1))), pod(res(9, 19)), NODE, []),
    ("both resources fit", pod(res(1, 1)), pod(res(5, 5)), NODE, []),
    ("one resource memory fits", pod(res(2, 1)), pod(res(9, 5)), NODE, ["Insufficient cpu"]),
    ("one resource cpu fits", pod(res(1, 2)), pod(res(5, 19)), NODE, ["Insufficient memory"]),
    ("equal edge case", pod(res(5, 1)), pod(res(5, 19)), NODE, []),
    ("equal edge case for init container", pod(res(4, 1), init=(res(5, 1),)), pod(res(5, 19)), NODE, []),
    ("extended resource fits", pod(ext(EXT_A, 1)), pod(res()), NODE, []),
    ("extended resource fits for init container", pod(res(), init=(ext(EXT_A, 1),)), pod(res()), NODE, []),
    ("extended resource capacity enforced", pod(ext(EXT_A, 10, 1, 1)), pod(ext(EXT_A, 0)), NODE,
     [f"Insufficient {EXT_A}"]),
    ("extended resource capacity enforced for init container", pod(res(), init=(ext(EXT_A, 10, 1, 1),)),
     pod(ext(EXT_A, 0)), NODE, [f"Insufficient {EXT_A}"]),
    ("extended resource allocatable enforced", pod(ext(EXT_A, 1, 1, 1)), pod(ext(EXT_A, 5)), NODE,
     [f"Insufficient {EXT_A}"]),
    ("extended resource allocatable enforced for init container", pod(res(), init=(ext(EXT_A, 1, 1, 1),)),
     pod(ext(EXT_A, 5)), NODE, [f"Insufficient {EXT_A}"]),
    ("extended resource allocatable enforced for multiple containers", pod(ext(EXT_A, 3, 1, 1), ext(EXT_A, 3, 1, 1)),
     pod(ext(EXT_A, 2)), NODE, [f"Insufficient {EXT_A}"]),
    ("extended resource allocatable admits multiple init containers",
     pod(res(), init=(ext(EXT_A, 3, 1, 1), ext(EXT_A, 3, 1, 1))), pod(ext(EXT_A, 2)), NODE, []),
    ("extended resource allocatable enforced for multiple init containers",
     pod(res(), init=(ext(EXT_A, 6, 1, 1), ext(EXT_A, 3, 1, 1))), pod(ext(EXT_A, 2)), NODE,
     [f"Insufficient {EXT_A}"]),
    ("extended resource allocatable enforced for unknown resource", pod(ext(EXT_B, 1, 1, 1)), pod(res()), NODE,
     [f"Insufficient {EXT_B}"]),
    ("extended resource allocatable enforced for unknown resource for init container",
     pod(res(), init=(ext(EXT_B, 1, 1, 1),)), pod(res()), NODE, [f"Insufficient {EXT_B}"]),
    ("kubernetes.io resource capacity enforced", pod(ext(K8S_IO_A, 10, 1, 1)), pod(res()), NODE,
     [f"Insufficient {K8S_IO_A}"]),
    ("kubernetes.io resource capacity enforced for init container", pod(res(), init=(ext(K8S_IO_B, 10, 1, 1),)),
     pod(res()), NODE, [f"Insufficient {K8S_IO_B}"]),
    ("hugepages resource capacity enforced", pod(ext(HUGE_A, 10, 1, 1)), pod(ext(HUGE_A, 0)), NODE,
     [f"Insufficient {HUGE_A}"]),
    ("hugepages resource capacity enforced for init container", pod(res(), init=(ext(HUGE_A, 10, 1, 1),)),
     pod(ext(HUGE_A, 0)), NODE, [f"Insufficient {HUGE_A}"]),
    ("hugepages resource allocatable enforced for multiple containers",
     pod(ext(HUGE_A, 3, 1, 1), ext(HUGE_A, 3, 1, 1)), pod(ext(HUGE_A, 2)), NODE, [f"Insufficient {HUGE_A}"]),
    ("skip checking extended resource request with quantity zero via resource groups", pod(ext(EXT_A, 0, 1, 1)),
     pod(ext(EXT_A, 6)), NODE, []),
    ("skip checking resource request with quantity zero", pod(ext(EXT_A, 1)), pod(ext(EXT_A, 1, 20, 30)), NODE, []),
    # TestNotEnoughRequests
    ("even without specified resources, predicate fails when there's no space for additional pod", EMPTY_POD,
     pod(res(10, 20)), ONE_POD_NODE, ["Too many pods"]),
    ("even if both resources fit, predicate fails when there's no space for additional pod", pod(res(1, 1)),
     pod(res(5, 5)), ONE_POD_NODE, ["Too many pods"]),
    ("even for equal edge case, predicate fails when there's no space for additional pod", pod(res(5, 1)),
     pod(res(5, 19)), ONE_POD_NODE, ["Too many pods"]),
    ("even for equal edge case, predicate fails when there's no space for additional pod due to init container",
     pod(res(5, 1), init=(res(5, 1),)), pod(res(5, 19)), ONE_POD_NODE, ["Too many pods"]),
    # TestStorageRequests
    ("empty storage requested, and pod fits", pod(res(1, 1)), pod(res(2, 10)), NODE, []),
    ("storage ephemeral local storage request exceeds allocatable", pod(res(storage=25)), pod(res(2, 2)), NODE,
     ["Insufficient ephemeral-storage"]),
    ("ephemeral local storage is sufficient", pod(res(storage=5)), pod(res(2, 2, 10)), NODE, []),
    ("pod fits", pod(res(storage=10)), pod(res(2, 2)), NODE, []),
]


@pytest.mark.parametrize("name, wanted, bound, allocatable, reasons", VECTORS, ids=[v[0] for v in VECTORS])
def test_fit_follows_the_schedulers_own_cases(name, wanted, bound, allocatable, reasons):
    assert fits_request(wanted, [bound], allocatable) == reasons


def test_limits_stand_for_missing_requests_as_the_api_server_defaults_them():
    limited = {"spec": {"containers": [{"resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}}]}}
    assert fits_request(limited, [], {"cpu": 4, "nvidia.com/gpu": 0}) == ["Insufficient nvidia.com/gpu"]
    assert fits_request(limited, [limited], {"cpu": 3, "nvidia.com/gpu": 2}) == ["Insufficient cpu"]


def test_the_failedscheduling_message_sorts_the_reasons_as_the_schedulers_fit_error_does():
    assert unschedulable_message(["Insufficient memory", "Insufficient cpu"]) == (
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. preemption: 0/1 nodes are available: 1 "
        "No preemption victims found for incoming pod.")
