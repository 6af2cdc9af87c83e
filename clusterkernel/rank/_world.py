"""This rank's MPI world: ``MPI.COMM_WORLD``, until a respawn merges new ranks in (rank side).

A respawned rank (:mod:`clusterkernel.rank._respawn`) is a new MPI job joined to the
survivors through ``MPI_Comm_spawn``; its ``COMM_WORLD`` holds itself alone, and the
survivors' still holds the dead process. The communicator that spans the N ranks
again, in the old rank order, is installed here, and everything that asks "who is
in my world" asks :func:`world` (comm's world group, torchrun's environment, the
engine's identity).

Example::

    from clusterkernel.rank._world import world
    world().Get_rank(), world().Get_size()
"""

from __future__ import annotations

import sys

_replaced = None  # the merged communicator after a respawn, else None


def world():
    """The communicator of every rank of this job, in rank order."""
    if _replaced is not None:
        return _replaced
    from mpi4py import MPI

    return MPI.COMM_WORLD


def replaced() -> bool:
    """Whether a respawn has replaced this rank's world (``MPI.COMM_WORLD`` no longer is)."""
    return _replaced is not None


def replace(comm, group_keys: list | tuple = ()) -> None:
    """Make ``comm`` this rank's world. Collective over ``comm`` where comm is in use:
    its world group follows, and the groups named by ``group_keys`` (every rank passes
    the same list, see ``comm._groups.group_keys``) are made again in it."""
    global _replaced
    _replaced = comm
    if group_keys or "clusterkernel.comm._groups" in sys.modules:
        from clusterkernel.comm import _groups

        _groups.rebind_world(comm, list(group_keys))
