"""This rank's MPI world: ``MPI.COMM_WORLD``, until a respawn merges new ranks in (rank side).

A respawned rank (:mod:`clusterkernel.rank._respawn`) is a new MPI job joined to the
survivors through ``MPI_Comm_spawn``; its ``COMM_WORLD`` holds itself alone, and the
survivors' still holds the dead process. The communicator that spans the N ranks
again, in the old rank order, is installed by :func:`replace`. The world itself is
held in :mod:`clusterkernel.protocol._engine`, below the rank-side libraries that ask
for it (comm's world group, torchrun's environment), so they never import ``rank/``;
:func:`world` and :func:`replaced` here are that module's.

Example::

    from clusterkernel.rank._world import world
    world().Get_rank(), world().Get_size()
"""

from __future__ import annotations

import sys

from clusterkernel.protocol._engine import replaced, set_world, world

__all__ = ["replace", "replaced", "world"]


def replace(comm, group_keys: list | tuple = ()) -> None:
    """Make ``comm`` this rank's world. Collective over ``comm`` where comm is in use:
    its world group follows, and the groups named by ``group_keys`` (every rank passes
    the same list, see ``comm._groups.group_keys``) are made again in it."""
    set_world(comm)
    if group_keys or "clusterkernel.comm._groups" in sys.modules:
        from clusterkernel.comm import _groups

        _groups.rebind_world(comm, list(group_keys))
