"""What the rank-side libraries ask of the engine they run in (rank side, the standard library only).

``comm``, ``torchdist``, ``metrics``, ``train`` and ``partition`` stand below
:mod:`clusterkernel.rank` (the engine's glue): they never import it. What they need of
the engine is here, set by ``rank/`` when it has something to say, with a default for
a job under plain ``mpiexec`` (no engine, nothing registered):

- :func:`world`: the communicator of every rank of this job. ``MPI.COMM_WORLD`` unless
  a respawn merged new ranks in (``rank/_world.replace`` calls :func:`set_world`; a
  respawned rank's own ``COMM_WORLD`` holds itself alone);
- :func:`user_namespace`: the globals of the user's cells (a plain script's
  ``__main__``);
- :data:`recovery`: the recovery point of a guarded training step (``train``), a dead
  peer replaced inside the running cell. ``rank/`` registers its in-cell recovery
  (:func:`register_recovery`); with none registered no death is recovered.

This module imports no more than the standard library (mpi4py only when
:func:`world` is asked with none set), so the notebook may load ``protocol/`` whole.

Example::

    from clusterkernel.protocol._engine import recovery, world

    world().Get_rank(), world().Get_size()
    recovery.armed()        # False under plain mpiexec, or before the notebook arms it
"""

from __future__ import annotations

import sys
from typing import Any

_world: Any = None  # the merged communicator after a respawn, else None
_recovery: Any = None  # rank._recovery, once the rank side registers it


def world() -> Any:
    """The communicator of every rank of this job, in rank order."""
    if _world is not None:
        return _world
    from mpi4py import MPI

    return MPI.COMM_WORLD


def replaced() -> bool:
    """Whether a respawn has replaced this rank's world (``MPI.COMM_WORLD`` no longer is)."""
    return _world is not None


def set_world(comm: Any) -> None:
    """Make ``comm`` this rank's world (``rank/_world.replace``, which also remakes
    comm's groups in it)."""
    global _world
    _world = comm


def user_namespace() -> dict:
    """The engine's user namespace, the globals of its cells (a plain script's: ``__main__``'s)."""
    if "IPython" in sys.modules:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.user_global_ns
    return vars(sys.modules["__main__"])


# what a rank with no recovery registered answers (a job under plain mpiexec): no death
# is recovered, as rank._recovery answers before the notebook arms it
_NOTHING_TO_RECOVER: dict[str, Any] = {
    "armed": lambda: False,
    "recovers": lambda exc: False,
    "rejoin": lambda *args, **kwargs: False,
    "take_joining": lambda: None,
}


class _Recovery:
    """The in-cell recovery point as a guarded step sees it: the registered one's
    functions (``rank._recovery``: ``armed``, ``recovers``, ``rejoin``, ...), or
    "nothing to recover" where none is registered."""

    def __getattr__(self, name: str) -> Any:
        if _recovery is not None:
            return getattr(_recovery, name)
        try:
            return _NOTHING_TO_RECOVER[name]
        except KeyError:
            raise AttributeError(
                f"no in-cell recovery is registered on this rank, so it has no {name!r} "
                "(ask recovery.armed() first)"
            ) from None


recovery = _Recovery()
"""This rank's in-cell recovery point (``train``'s step guards ask it)."""


def register_recovery(impl: Any) -> None:
    """Answer :data:`recovery` with ``impl`` (a module: ``armed``, ``recovers``,
    ``rejoin``, ``take_joining``, ...): ``rank/`` registers its in-cell recovery."""
    global _recovery
    _recovery = impl
