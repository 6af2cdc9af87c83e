"""One GPU (or K) per rank, by ``LOCAL_RANK``, and what each rank's GPU is doing (rank side).

The binding is ``torch.cuda.set_device``, every GPU of the node left visible, not a
``CUDA_VISIBLE_DEVICES`` per rank: code written for torchrun indexes devices by
``LOCAL_RANK`` (``torch.device("cuda", local_rank)``), which a rank that sees one GPU
only would not have. The decision itself (:func:`devices_for`) is a pure function of
the rank's place on its node, the GPUs it sees and the options, so it is tested
without GPUs.

Example::

    devices_for(local_rank=1, local_world_size=4, device_count=8, gpus_per_rank=2)  # [2, 3]
    bind(gpus_per_rank=1)     # on a rank: its GPU becomes torch's current device
"""

from __future__ import annotations

import os
import socket

from clusterkernel.protocol._errors import ClusterkernelError


class GpuBindingError(ClusterkernelError, RuntimeError):
    """The ranks on a node cannot each get the GPUs asked for."""


def devices_for(
    local_rank: int,
    local_world_size: int,
    device_count: int,
    gpus_per_rank: int = 1,
    share: bool = False,
) -> list[int]:
    """The GPU indices (as this process numbers them) of the rank ``local_rank`` of a node.

    ``share``: more ranks than GPUs is allowed, ranks taking GPUs round robin.
    Raises :class:`GpuBindingError` saying what to do when the node has too few.
    """
    if gpus_per_rank < 1:
        raise GpuBindingError(f"gpus_per_rank must be at least 1, got {gpus_per_rank}.")
    if device_count == 0:
        raise GpuBindingError(
            "this host has no GPU (torch.cuda.device_count() is 0); start without "
            "--gpus-per-rank, or on GPU nodes."
        )
    need = local_world_size * gpus_per_rank
    if need > device_count and not share:
        raise GpuBindingError(
            f"{local_world_size} ranks x {gpus_per_rank} GPU(s) need {need} GPUs and this "
            f"host has {device_count}: start at most {device_count // gpus_per_rank} ranks "
            "per node, or let ranks share GPUs (--gpu-share)."
        )
    if gpus_per_rank > device_count:
        raise GpuBindingError(f"{gpus_per_rank} GPUs per rank, and this host has {device_count}.")
    first = (local_rank * gpus_per_rank) % device_count
    return [(first + i) % device_count for i in range(gpus_per_rank)]


def has_gpus() -> bool:
    """Whether this host may have NVIDIA GPUs, without importing torch (cheap)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")


def bind(gpus_per_rank: int = 1, share: bool = False) -> dict:
    """Make this rank's first GPU torch's current device; ``{"devices": [...]}``.

    Reads ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (set by ``torchrun_env``). A host
    without GPUs is an error naming the rank: the binding was asked for.
    """
    import torch

    where = f"rank {os.environ.get('RANK', '?')} on {socket.gethostname()}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        devices = devices_for(
            int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            count,
            gpus_per_rank,
            share,
        )
    except GpuBindingError as e:
        raise GpuBindingError(f"{where}: {e}") from None
    torch.cuda.set_device(devices[0])
    os.environ["CLUSTERKERNEL_GPUS"] = ",".join(map(str, devices))
    return {"devices": devices}


def bind_ranks(gpus_per_rank: int | None = None, share: bool = False) -> dict:
    """What every fresh rank runs: bind a GPU where this host has them.

    ``gpus_per_rank`` None: one per rank if the host has GPUs, nothing otherwise; 0:
    no binding; K: K per rank, and a host without GPUs is an error.
    """
    if gpus_per_rank == 0:
        return {}
    if gpus_per_rank is None and not has_gpus():
        return {}
    return bind(gpus_per_rank or 1, share)


def prepare_rank(gpus_per_rank: int | None = None, share: bool = False) -> dict:
    """What a fresh rank gets in one call: torchrun's environment, then its GPU."""
    from clusterkernel.torchdist._env import torchrun_env

    torchrun_env()
    return bind_ranks(gpus_per_rank, share)


def device_status() -> dict | None:
    """This rank's GPU: name, memory used/total (MiB), utilisation %; None without one.

    Reads NVML (``nvidia-ml-py``, optional) for the GPU the binding gave this rank,
    else torch's current device where torch is loaded with CUDA.
    """
    chosen = os.environ.get("CLUSTERKERNEL_GPUS")
    if not chosen or not has_gpus():
        return None
    index = int(chosen.split(",")[0])
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_physical(index))
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        return {
            "gpu": index,
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "mem_used_mib": mem.used / 2**20,
            "mem_total_mib": mem.total / 2**20,
            "util": float(util.gpu),
        }
    except Exception:  # no NVML: what torch knows, without utilisation
        import torch

        free, total = torch.cuda.mem_get_info(index)
        return {
            "gpu": index,
            "name": torch.cuda.get_device_name(index),
            "mem_used_mib": (total - free) / 2**20,
            "mem_total_mib": total / 2**20,
            "util": None,
        }


def _physical(index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return index
    ids = [v.strip() for v in visible.split(",")]
    return int(ids[index]) if ids[index].isdigit() else index
