"""Communication on torch tensors between MPI ranks, named like ``torch.distributed``.

The PyTorch "Writing Distributed Applications" tutorial ports by renaming ``dist``
to ``comm``::

    from clusterkernel import comm

    t = torch.ones(4) * comm.rank()
    comm.all_reduce(t, op=comm.SUM)                      # in place, every rank
    w = comm.all_reduce(t, op=comm.AVG, async_op=True)   # returns a Work
    w.wait()
    comm.all_reduce(t, algorithm="ring")                 # the project's own ring
    comm.all_reduce(t, algorithm="mpi")                  # MPI's (default: "auto" picks)
    comm.all_reduce(t, algorithm="shm")                  # through shared memory (one node)
    comm.all_reduce(t, algorithm="hier")                 # shm per node, MPI between nodes
    g = comm.shm_empty(1 << 24)                          # a tensor in shared memory
    comm.all_reduce(g, algorithm="shm")                  # reduced without copies in/out
    comm.all_reduce_coalesced(grads, bucket_bytes=1 << 20)
    pair = comm.new_group([0, 1])

- Point-to-point: :func:`send`, :func:`recv`, :func:`isend`, :func:`irecv`,
  :func:`send_object`, :func:`recv_object`.
- Collectives: :func:`broadcast`, :func:`reduce`, :func:`all_reduce`,
  :func:`scatter`, :func:`gather`, :func:`all_gather`, :func:`reduce_scatter`,
  :func:`all_to_all` (plus ``*_tensor`` / ``*_single`` forms), :func:`barrier`,
  and object forms (:func:`broadcast_object`, :func:`gather_object`, ...).
- Every call takes ``group=`` and ``async_op=``, and is timed into
  ``clusterkernel.metrics.recorder()``.
- ``algorithm="shm"`` (all_reduce, broadcast, all_gather, reduce_scatter and their
  tensor forms, all_reduce_coalesced) moves data through an MPI-3 shared window
  of the group's ranks, which must share one node. :func:`shm_empty` allocates a
  tensor inside that shared memory (collective); all-reduce on such tensors skips
  the copy in and out.
- ``algorithm="auto"``, the default of every call that takes ``algorithm=``, picks
  MPI, the ring, shared memory or the hierarchy by size, group size and node
  layout from a table measured on this machine (:func:`tune`) or shipped with it;
  :func:`auto_choice` tells what it picks, and each timing record names what ran.
  ``CLUSTERKERNEL_ALGORITHM=mpi`` forces one algorithm everywhere.
- Mismatches are caught: the first call of each new signature (op, size, dtype,
  reduce op, root) on a group is compared across its ranks before data moves, so a
  rank passing another size raises :class:`CollectiveMismatchError` on every rank
  instead of hanging or returning wrong sums. ``set_check("every")`` (or
  ``CLUSTERKERNEL_COMM_CHECK=every``) compares every call, shapes included;
  ``set_check("off")`` none; :func:`check_mode` says which is in force.
- The flight recorder (:func:`flight`) keeps each rank's last calls (op, sequence
  number per group, bytes, dtype, calling line); the notebook's hang report
  compares them across ranks.

CPU tensors travel zero-copy through mpi4py's buffer interface; float16 and
bfloat16 are reduced in float32; non-contiguous and device tensors are staged
through a contiguous host copy (device tensors go direct when MPI is CUDA-aware).
Where the ranks have a torch.distributed default group with a backend for CUDA
(``%mpi start --torch`` on GPU nodes: NCCL), CUDA tensors go through it instead,
checked, recorded and timed as comm's own calls (:func:`route_to_torch`).

Where things are (all private but this module)::

    the calls      _reductions  _gathers  _alltoall  _p2p  _objects  _fusion  _tensorlists
    every call's   _groups (who)  _dtypes, _ops (what)  _plan (every call's plan)
      steps        _begin, _check (agreement)  _flight, _ledger (entry, record)
                   _handle, _turns (running, Work)  _errors
    algorithms     _ring  _hier  _shm/ (segment, pipe, steps, alloc: shared memory;
                   _cpipe.c: the pipeline's chunk loop in C)
    choosing       _auto/ (rules, tune, table, auto_table.json)
    other paths    _fastpath + _fast.c (all_reduce's common case in C)
                   _torchpath (CUDA tensors through NCCL)  _hugepages (big buffers)
"""

from __future__ import annotations

from clusterkernel.comm._alltoall import all_to_all, all_to_all_single
from clusterkernel.comm._auto import auto_choice
from clusterkernel.comm._auto.adapt import auto_state
from clusterkernel.comm._auto.tune import tune
from clusterkernel.comm._check import check_enabled, check_mode, set_check
from clusterkernel.comm._dtypes import cuda_aware, force_staging
from clusterkernel.comm._errors import CollectiveMismatchError, CommError, PeerDiedError
from clusterkernel.comm._flight import flight, set_flight
from clusterkernel.comm._fusion import DEFAULT_BUCKET_BYTES, all_reduce_coalesced
from clusterkernel.comm._gathers import (
    all_gather,
    all_gather_into_tensor,
    barrier,
    broadcast,
    gather,
    scatter,
)
from clusterkernel.comm._groups import (
    WORLD,
    Group,
    destroy_group,
    new_group,
    node_group,
    rank,
    size,
    split,
)
from clusterkernel.comm._handle import Work
from clusterkernel.comm._objects import (
    all_gather_object,
    broadcast_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from clusterkernel.comm._ops import AVG, MAX, MIN, PRODUCT, SUM, ReduceOp
from clusterkernel.comm._p2p import irecv, isend, recv, recv_object, send, send_object
from clusterkernel.comm._reductions import all_reduce, reduce, reduce_scatter, reduce_scatter_tensor
from clusterkernel.comm._shm.alloc import shm_empty
from clusterkernel.comm._torchpath import route_to_torch

# torch.distributed spellings, so ported code runs unchanged.
get_rank = rank
get_world_size = size
reduce_op = ReduceOp  # the old name used by the PyTorch tutorial


def init_process_group(backend: str | None = None, **kwargs: object) -> None:
    """Accepted for code ported from ``torch.distributed``; does nothing.

    MPI was initialised when the rank started (under ``mpiexec``), so there is
    nothing to set up: ``comm.init_process_group("gloo", rank=r, world_size=n)``
    simply returns.
    """


def is_initialized() -> bool:
    """Always True: the MPI ranks are running."""
    return True


__all__ = [
    "AVG",
    "DEFAULT_BUCKET_BYTES",
    "MAX",
    "MIN",
    "PRODUCT",
    "SUM",
    "WORLD",
    "CollectiveMismatchError",
    "CommError",
    "PeerDiedError",
    "Group",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "auto_choice",
    "auto_state",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "check_enabled",
    "check_mode",
    "cuda_aware",
    "destroy_group",
    "flight",
    "force_staging",
    "gather",
    "gather_object",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "irecv",
    "is_initialized",
    "isend",
    "new_group",
    "node_group",
    "rank",
    "route_to_torch",
    "recv",
    "recv_object",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object",
    "set_check",
    "set_flight",
    "shm_empty",
    "size",
    "split",
    "tune",
]


def _tell_if_slow() -> None:
    import warnings

    from clusterkernel.comm import _fastpath

    note = _fastpath.missing_note()
    if note is not None:
        warnings.warn(note, RuntimeWarning, stacklevel=3)


_tell_if_slow()
