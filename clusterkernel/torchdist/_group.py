"""The default process group on a rank: made, re-made, destroyed, aborted (rank side).

What ``%mpi start --torch`` runs on every rank after start and restart
(:func:`init`), what ``%mpi restart``/``stop`` run before the ranks go
(:func:`destroy`), what frees a rank blocked in a gloo or NCCL collective
(:func:`abort`, from the engine's control thread) and ``%mpi torch-reinit``
(:func:`reinit`): a new default group in the same processes, variables kept.

Example (on every rank, e.g. in a ``%%mpi`` cell)::

    from clusterkernel import torchdist
    torchdist.init()              # backend as torch picks it: gloo on CPU, nccl on GPU
    torchdist.reinit()            # after an abort: a fresh group, a fresh port
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from datetime import timedelta

from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.torchdist import _subgroups

BACKENDS = ("gloo", "nccl")

# The backend of the last group this process had, for reinit after an abort.
_last_backend: str | None = None
# An abort closed this process's default group and none was made or destroyed since:
# a respawn inside a running cell makes one again (see :func:`held`).
_closed = False
# One abort at a time: the second finds no group (torch's own abort fails on a group
# another thread's abort is taking apart).
_aborting = threading.Lock()


class BackendError(ClusterkernelError, RuntimeError):
    """The ranks cannot run the process-group backend that was asked for."""


def _where() -> str:
    return f"rank {os.environ.get('RANK', '?')} on {socket.gethostname()}"


def check_backend(backend: str | None) -> None:
    """Raise :class:`BackendError` saying what to do if this rank cannot run ``backend``.

    ``None`` is torch's own pick (gloo for CPU tensors, and nccl for CUDA ones where
    there are GPUs) and always works where torch.distributed does.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise BackendError(f"{_where()}: this torch was built without torch.distributed.")
    if backend is None:
        return
    if backend not in BACKENDS:
        raise BackendError(
            f"backend {backend!r}: use one of {', '.join(BACKENDS)} (or leave it out)."
        )
    if not dist.is_backend_available(backend):
        raise BackendError(
            f"{_where()}: this torch ({torch.__version__}) has no {backend} backend; "
            "use --backend gloo (CPU), or leave --backend out."
        )
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if gpus == 0:
            raise BackendError(
                f"{_where()}: --backend nccl needs a GPU for every rank and this host has "
                "none (torch.cuda.is_available() is False). Use --backend gloo, or start "
                "the ranks on GPU nodes."
            )
        if gpus < local:
            raise BackendError(
                f"{_where()}: {local} ranks share this host's {gpus} GPU(s); NCCL needs one "
                f"GPU per rank. Start at most {gpus} ranks per node."
            )


def pick_backend(asked: str | None, gpus: int, local_ranks: int) -> str | None:
    """The backend ``init`` hands torch: ``asked`` where given; else torch's own pick
    (``None``: gloo for CPU tensors, NCCL for CUDA ones), except where that cannot run.

    On a host without GPUs it is plain ``gloo`` (torch's pick would make
    ``cpu:gloo,cuda:gloo``, whose ``get_backend()`` reads "undefined"). Where ranks
    share GPUs (``--gpu-share``, more ranks on the host than GPUs) it is ``gloo`` too:
    NCCL refuses two ranks of one group on one GPU, and gloo moves CUDA tensors.

    Example::

        pick_backend(None, gpus=8, local_ranks=8)   # None: torch picks, NCCL for CUDA
        pick_backend(None, gpus=1, local_ranks=2)   # 'gloo': two ranks share one GPU
    """
    if asked is not None:
        return asked
    if gpus == 0 or local_ranks > gpus:
        return "gloo"
    return None


def describe() -> dict:
    """This rank's default group: backend, rank, world size, rendezvous (empty without one)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return {}
    return {
        "backend": backend_name(dist),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
    }


def init(backend: str | None = None, timeout: float | None = None) -> dict:
    """Make the default process group from torchrun's variables, unless there is one.

    Collective: every rank calls it. ``backend`` None lets torch pick by device.
    With NCCL each rank takes the GPU numbered by its ``LOCAL_RANK``. Returns
    :func:`describe`.
    """
    global _last_backend, _closed
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return describe()
    check_backend(backend)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = pick_backend(backend, gpus, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    kwargs: dict = {}
    if timeout is not None:
        kwargs["timeout"] = timedelta(seconds=timeout)
    if backend == "nccl":
        bound = os.environ.get("CLUSTERKERNEL_GPUS")  # the GPU binding's pick
        index = int(bound.split(",")[0]) if bound else int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(backend=backend, **kwargs)
    _last_backend = backend
    _closed = False
    # the subgroups made so far hold the old group's world: a respawn makes them again
    _subgroups.rotate()
    return describe()


def destroy() -> bool:
    """Destroy every process group of this rank, if it has any; True if it had."""
    if not _destroy():
        return False
    _subgroups.forget()  # destroyed on purpose: no subgroup to make again
    return True


def _destroy() -> bool:
    """Destroy the groups, keeping the record of the subgroups made (:func:`reinit`)."""
    global _closed
    _closed = False  # destroyed on purpose: nothing to make again
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    _remember_backend(dist)
    dist.destroy_process_group()
    return True


def shutdown(namespace: dict | None = None) -> bool:
    """The end of a script: free what holds the groups, then destroy them; True if any.

    For ``atexit`` (exported jobs register it). Drops the modules (a DDP or FSDP model
    holds its group), device meshes and groups among ``namespace``'s values (default:
    ``__main__``'s globals), so the groups are freed, and their gloo threads joined,
    while the interpreter still runs. Otherwise a gloo thread may still be finishing a
    DDP call when Python shuts down, and the process dies with "terminate called
    without an active exception" (torch 2.13: 7 of 30 plain torchrun DDP runs here,
    0 of 30 with this).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    import gc

    import torch

    holders = (torch.nn.Module, dist.ProcessGroup, dist.device_mesh.DeviceMesh)
    names = vars(sys.modules["__main__"]) if namespace is None else namespace
    for key, value in list(names.items()):
        if isinstance(value, holders):
            del names[key]
    gc.collect()
    return destroy()


def abort() -> bool:
    """Abort every process group of this rank (safe from another thread); True if it had any.

    First shuts down the TCP connections of every group this process made
    (:func:`clusterkernel.torchdist._sockets.cut`): a collective blocked in gloo
    raises at once, here and on its peers, even while a DDP or FSDP model holds the
    group. Then torch's own abort (``ncclCommAbort`` for NCCL) drops the groups.
    Variables, models and optimizers stay; models wrapped in DDP hold the old group
    and are wrapped again with :func:`rewrap` once a new group is made.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    from torch.distributed.distributed_c10d import _abort_process_group

    from clusterkernel.torchdist._sockets import cut

    global _closed
    with _aborting:  # the main thread's (a recovery) and the control thread's at once
        if not dist.is_initialized():
            return False
        _remember_backend(dist)
        cut()
        _abort_process_group()
        _closed = True
    return True


def held() -> bool:
    """Whether this rank has a default group, or had one that :func:`abort` closed (and
    none was made or destroyed since): what a respawn inside a running cell makes again."""
    dist = sys.modules.get("torch.distributed")
    live = dist is not None and dist.is_available() and dist.is_initialized()
    return live or _closed


def last_backend() -> str | None:
    """The backend of the last default group this rank had (None: torch's pick by device)."""
    return _last_backend


def device_backends(dist, group=None) -> dict[str, str]:
    """The backend of ``group`` (the default group if None) per device type, from
    torch's public config: ``{"cpu": "gloo", "cuda": "nccl"}`` for torch's pick by
    device (for which ``get_backend()`` reads "undefined"), ``{"cpu": "gloo"}`` for
    gloo alone.

    Example: ``device_backends(torch.distributed).get("cuda")``
    """
    spec = str(dist.get_backend_config(group))
    if ":" in spec:
        return dict(part.split(":", 1) for part in spec.split(","))
    return {d: spec for d in dist.Backend.backend_capability.get(spec, ())}


def backend_name(dist) -> str:
    """The default group's backend: ``gloo``, ``nccl``, or torch's pick by device as
    torch writes it (``cpu:gloo,cuda:nccl``)."""
    name = str(dist.get_backend())
    if name not in BACKENDS:  # torch's pick by device reads "undefined" here
        single = set(device_backends(dist).values())
        name = single.pop() if len(single) == 1 else str(dist.get_backend_config())
    return name


def _remember_backend(dist) -> None:
    global _last_backend
    try:
        name = str(dist.get_backend())
    except Exception:  # a group torch no longer knows: keep the last one
        return
    # torch's own pick ("undefined" here) is made again by asking for None
    _last_backend = name if name in BACKENDS else None


def reinit(backend: str | None = None, timeout: float | None = None) -> dict:
    """A new default group in this live process: destroy what is left, fresh rendezvous,
    init; then the subgroups made with ``dist.new_group`` are made again on it and the
    user's names that held them rebound (:func:`~clusterkernel.torchdist._subgroups.remake`).

    Collective over MPI's world and torch's new group: every rank calls it.
    ``backend`` defaults to the last group's. Variables stay; a model wrapped in
    DDP/FSDP holds the old group and must be wrapped again. Returns :func:`describe`
    and ``"subgroups"``: the names rebound to a subgroup made again (``["g"]``).
    """
    from clusterkernel.protocol._engine import user_namespace
    from clusterkernel.torchdist._env import torchrun_env

    try:
        _destroy()
    except Exception:  # an aborted group may be half gone: a new one is made anyway
        pass
    torchrun_env()
    made = init(backend if backend is not None else _last_backend, timeout)
    return {**made, "subgroups": _subgroups.remake(user_namespace())["names"]}
