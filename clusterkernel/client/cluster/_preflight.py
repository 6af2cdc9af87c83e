"""GPU and backend requests checked in the notebook before any rank starts (client side).

Where every rank runs on this machine (``mpiexec`` without other hosts), what the
ranks would find is what this process finds: the same GPUs and, ranks being started
with ``sys.executable``, the same torch. So ``gpus_per_rank`` without a GPU, or more
GPUs than the machine has, and ``backend="nccl"`` where NCCL cannot run, are refused
by :func:`check_local` at ``Cluster(...)``, in milliseconds, instead of by every rank
after a start of several seconds. A machine without an NVIDIA device is recognised
without importing torch; torch is imported only where GPUs are present. Ranks on
other machines (Slurm, ``hosts=``/``hostfile=``) are checked where they run
(``clusterkernel.torchdist``), and identical answers are shown once with their ranks.

Example::

    from clusterkernel.client.cluster import LaunchSettings
    check_local(LaunchSettings(n=2).build(), backend=None, gpus_per_rank=None)  # fine
    # on a machine without GPUs, check_local(..., gpus_per_rank=1) raises ValueError
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterkernel.client.launch import Launcher

# how a request names itself, for the API and %mpi start alike
_GPUS = "gpus_per_rank={k} (--gpus-per-rank {k})"
_NCCL = "backend='nccl' (--backend nccl)"
_ELSEWHERE = "start them on GPU nodes (launcher='slurm' / --slurm, or hosts= / --hosts)"


def ranks_run_here(launcher: Launcher) -> bool:
    """Whether every rank of ``launcher`` runs on this machine (``mpiexec``, no other host)."""
    return launcher.kind == "mpiexec" and not launcher.multi_node


def nvidia_device_visible(environ: Mapping[str, str]) -> bool:
    """Whether a process with ``environ`` may see an NVIDIA GPU here (no torch imported):
    a device file exists and ``CUDA_VISIBLE_DEVICES`` does not hide them all."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")


def check_gpus_per_rank(gpus_per_rank: int | None) -> None:
    """Raise ``ValueError`` unless ``gpus_per_rank`` is None (the default binding) or an
    int of 0 (no binding) or more: checked before the launch options are."""
    if gpus_per_rank is not None and (
        not isinstance(gpus_per_rank, int) or isinstance(gpus_per_rank, bool) or gpus_per_rank < 0
    ):
        raise ValueError(f"gpus_per_rank must be 0 (no binding) or more, got {gpus_per_rank!r}.")


def check_local(
    launcher: Launcher,
    *,
    backend: str | None,
    gpus_per_rank: int | None,
    gpu_share: bool = False,
    env: Mapping[str, str] | None = None,
) -> None:
    """Raise ``ValueError`` saying what to do if the ranks ``launcher`` starts on this
    machine cannot have the GPUs or the backend asked for; ranks elsewhere pass.

    ``env``: the ranks' extra environment (a ``CUDA_VISIBLE_DEVICES`` there is theirs).
    """
    wants_gpus = bool(gpus_per_rank)
    if not (wants_gpus or backend == "nccl") or not ranks_run_here(launcher):
        return
    ranks_env = {**os.environ, **(env or {})}
    n = launcher.n
    if not nvidia_device_visible(ranks_env):
        hidden = "CUDA_VISIBLE_DEVICES hides them" if os.path.exists("/dev/nvidia0") else ""
        where = (
            f"this machine, where the {n} ranks would run, has no GPU they can see "
            f"({hidden or 'no NVIDIA device'})"
        )
        if backend == "nccl":
            raise ValueError(
                f"{_NCCL} needs a GPU for every rank, but {where}. Use backend='gloo' "
                "(--backend gloo) or leave it out (torch picks gloo for CPU tensors), or "
                f"{_ELSEWHERE}."
            )
        raise ValueError(
            f"{_GPUS.format(k=gpus_per_rank)} asks for GPUs, but {where}. Leave it out to run "
            f"on the CPU, or {_ELSEWHERE}."
        )
    if env and "CUDA_VISIBLE_DEVICES" in env:
        return  # the ranks see other devices than this process: they check themselves
    import torch  # a machine with GPUs: torch itself says what it can use

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    build = f"this torch ({torch.__version__}, {sys.executable})"
    if backend == "nccl":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_backend_available("nccl")):
            raise ValueError(
                f"{_NCCL}: {build} has no NCCL backend. Install a CUDA build of torch, or "
                "use backend='gloo' (--backend gloo)."
            )
        if count < n:
            raise ValueError(
                f"{_NCCL} needs one GPU per rank: {n} ranks, and torch sees {count} GPU(s) "
                f"here. Start at most {count} ranks, or use backend='gloo' (--backend gloo)."
            )
    if not gpus_per_rank:
        return
    if count == 0:
        raise ValueError(
            f"{_GPUS.format(k=gpus_per_rank)}: {build} sees no GPU "
            "(torch.cuda.is_available() is False). Install a CUDA build of torch, or leave "
            "it out to run on the CPU."
        )
    need = n * gpus_per_rank
    if gpus_per_rank > count or (need > count and not gpu_share):
        raise ValueError(
            f"{n} ranks x {gpus_per_rank} GPU(s) need {need} GPUs and this machine has "
            f"{count}: start at most {count // gpus_per_rank} ranks, or let ranks share GPUs "
            "(gpu_share=True / --gpu-share)."
            if gpus_per_rank <= count
            else f"{_GPUS.format(k=gpus_per_rank)}, and this machine has {count} GPU(s)."
        )
