"""Which CUDA device a torchrun worker (local rank) uses.

Whole GPUs: ``cuda:<LOCAL_RANK>``. MIG devices: CUDA enumerates at most one MIG compute instance per process, the
first it is shown, so with several MIG devices in a pod (the NVIDIA device plugin lists their UUIDs, ``MIG-...``,
in ``NVIDIA_VISIBLE_DEVICES``) every local rank must be shown its own one alone, through ``CUDA_VISIBLE_DEVICES``,
before CUDA initialises, and then uses ``cuda:0``: ``cuda:1`` does not exist in rank 1.
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

MIG_PREFIX = "MIG-"


def mig_device(local_rank: int, local_world_size: int, nvidia_visible_devices: str) -> str | None:
    """The MIG device (UUID) local rank ``local_rank`` of ``local_world_size`` must see alone, or None when
    ``nvidia_visible_devices`` (a comma list, as the device plugin sets ``NVIDIA_VISIBLE_DEVICES``) has no MIG device.

    Raises:
        ValueError: fewer MIG devices than local ranks (the message names both and the fix).
    """
    devices = [d.strip() for d in nvidia_visible_devices.split(",") if d.strip().startswith(MIG_PREFIX)]
    if not devices:
        return None
    if len(devices) < local_world_size:
        raise ValueError(f"{local_world_size} processes on this node but NVIDIA_VISIBLE_DEVICES lists "
                         f"{len(devices)} MIG device(s) ({', '.join(devices)}); a process can use one MIG device: "
                         f"set nproc_per_node={len(devices)}, or cluster.mig_devices_per_node={local_world_size}")
    return devices[local_rank]


def pin_local_device(environ: MutableMapping[str, str] = os.environ) -> int:
    """Show this local rank its own MIG device (``CUDA_VISIBLE_DEVICES``) when the pod has MIG devices; call it
    before anything initialises CUDA (``torch.cuda.is_available()`` does). Returns the CUDA index to use: 0 with a
    MIG device, else ``LOCAL_RANK``.

    Raises:
        ValueError: fewer MIG devices than local ranks.
    """
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    device = mig_device(local_rank, int(environ.get("LOCAL_WORLD_SIZE", "1")),
                        environ.get("NVIDIA_VISIBLE_DEVICES", ""))
    if device is None:
        return local_rank
    environ["CUDA_VISIBLE_DEVICES"] = device
    return 0
