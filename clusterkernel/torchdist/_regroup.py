"""torch.distributed on a world made again by a respawn inside a running cell (rank side).

A respawn between cells gets its torch side from the notebook, one step at a time on
every rank: torchrun's environment and the rank's GPU (:func:`~clusterkernel.torchdist.
_gpu.prepare_rank`), the default group (:func:`~clusterkernel.torchdist._group.init`),
the user's subgroups made again and the DDP models of the namespace wrapped on them
(:func:`~clusterkernel.torchdist._rewrap.rewrap_namespace`). Inside a running cell the
notebook cannot reach the survivors (they run the cell), so the recovery
(``rank._recovery``) runs the same three steps itself, through :func:`regroup`, once
the new ranks have joined and taken their copy.

Example (collective over the world just grown, on every rank)::

    freed = free()                # a survivor entering the recovery: peers in gloo raise
    regroup({"gpus_per_rank": None, "share": False, "timeout": 120.0})   # -> ["ddp"]
"""

from __future__ import annotations

import sys
from datetime import timedelta

from clusterkernel.protocol._engine import world


def free() -> bool:
    """Close this rank's torch.distributed connections, if it has any (``_group.abort``):
    a peer blocked in a gloo collective on this rank raises at once, and so enters the
    recovery too. True if there was a group."""
    if "torch.distributed" not in sys.modules:
        return False
    from clusterkernel.torchdist._group import abort

    return abort()


def regroup(settings: dict | None) -> list[str] | None:
    """Collective over the world: where any rank has, or had until the recovery closed
    it, a default group, every rank gets a new one on this world (the first such rank's
    backend; ``settings``: ``gpus_per_rank``, ``share``, ``timeout``, as the notebook's
    ``--torch`` start gives them), the user's subgroups are made again on it and the DDP
    models of the namespace wrapped on their new group (``_rewrap.rewrap_namespace``).
    Returns the DDP models' names, or None where no rank had a group (nothing done)."""
    from clusterkernel.torchdist import _group

    comm = world()
    mine = (_group.held(), _group.last_backend()) if "torch.distributed" in sys.modules else None
    every = comm.allgather(mine)
    held = [m for m in every if m is not None and m[0]]
    if not held:
        return None
    from clusterkernel.torchdist._gpu import prepare_rank
    from clusterkernel.torchdist._rewrap import rewrap_namespace

    settings = settings or {}
    free()  # a survivor's group is closed already; one made since the death would not be
    prepare_rank(settings.get("gpus_per_rank"), bool(settings.get("share")))
    # A rank that dies while the group is made leaves the others in its rendezvous for
    # the whole timeout: a short one for the making (the recovery's next round spawns the
    # dead), the asked one for the collectives after.
    full = settings.get("timeout")
    _group.init(held[0][1], min(full, _MAKING) if full else _MAKING)
    if full is not None:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=full))
    return rewrap_namespace()["ddp"]


_MAKING = 20.0  # seconds for the new group's rendezvous, far above what it takes
