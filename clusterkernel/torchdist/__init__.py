"""PyTorch's own distributed stack on the ranks (rank side).

Your ``torch.distributed`` code (DDP, FSDP2, DeviceMesh, DTensor) runs unchanged in
``%%mpi`` cells: every rank has torchrun's environment (:func:`torchrun_env`, set at
every start and restart), so ``dist.init_process_group()`` just works, and
``%mpi start --torch`` makes the default group for you (:func:`init`). Around it,
clusterkernel reads torch's own flight recorder (:func:`flight`) for the hang
report, frees a rank blocked in gloo or NCCL while models still hold the group
(:func:`abort` shuts the groups' connections down), re-makes the group in the live
ranks (:func:`reinit`, ``%mpi torch-reinit``), wraps a DDP model again on it
(:func:`rewrap`), rebuilds an FSDP2 model on it from its last kept state
(:class:`Keeper`, also after a respawned rank), and streams torch's
collective timings to the dashboard (:mod:`._timings`).

Example (a ``%%mpi`` cell)::

    import torch.distributed as dist
    dist.init_process_group()                 # env:// from torchrun's variables
    model = torch.nn.parallel.DistributedDataParallel(net)
"""

from __future__ import annotations

from clusterkernel.metrics import _attached
from clusterkernel.torchdist import _ddp, _timings
from clusterkernel.torchdist._env import torchrun_env
from clusterkernel.torchdist._flight import flight
from clusterkernel.torchdist._group import (
    BackendError,
    abort,
    describe,
    destroy,
    init,
    reinit,
    shutdown,
)
from clusterkernel.torchdist._keep import Keeper
from clusterkernel.torchdist._rewrap import rewrap
from clusterkernel.torchdist._timings import timed_allreduce_hook

# metrics imports no torchdist: torchdist attaches its DDP watcher (DDP models made once
# the rank records metrics time their all-reduces) and its flight-recorder reader
_attached.when_recording(_ddp.watch)
_attached.add_collector(_timings.collect)

__all__ = [
    "torchrun_env",
    "init",
    "reinit",
    "destroy",
    "shutdown",
    "abort",
    "rewrap",
    "Keeper",
    "describe",
    "flight",
    "timed_allreduce_hook",
    "BackendError",
]
