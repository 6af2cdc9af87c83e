"""clusterkernel: a notebook or IPython REPL as the live front end of an MPI job.

Client side (in the notebook)::

    %load_ext clusterkernel
    %mpi start -n 4
    %%mpi
    from clusterkernel import comm
    print(comm.rank(), comm.size())

Engine side (inside each rank) the names mirror ``torch.distributed``:
``comm.all_reduce(t, op=comm.SUM)``, ``comm.send``, ``comm.new_group`` ...

Imports are lazy so that each side only loads what it needs: a rank importing
``clusterkernel.comm`` never loads IPython display code or ipywidgets, and the
notebook never loads mpi4py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Cluster": "clusterkernel.client.cluster",
    "ClusterError": "clusterkernel.client.cluster",
    "ClusterkernelError": "clusterkernel.protocol._errors",
    "RankError": "clusterkernel.client.cluster",
    "MPINotFoundError": "clusterkernel.client.mpiexec",
    "HostError": "clusterkernel.client.mpiexec",
    "comm": "clusterkernel.comm",
    "partition": "clusterkernel.partition",
    "data": "clusterkernel.data",
    "train": "clusterkernel.train",
    "DataParallel": "clusterkernel.train",
    "PipelineParallel": "clusterkernel.train",
    "Trainer": "clusterkernel.train",
    "metrics": "clusterkernel.metrics",
    "log": "clusterkernel.metrics",
    "Dashboard": "clusterkernel.client.dashboard",
}

__all__ = sorted([*_LAZY, "current_cluster", "load_ipython_extension", "unload_ipython_extension"])

if TYPE_CHECKING:  # pragma: no cover
    from clusterkernel.client.cluster import Cluster, ClusterError, RankError  # noqa: F401
    from clusterkernel.protocol._errors import ClusterkernelError  # noqa: F401


def __getattr__(name: str) -> Any:
    modname = _LAZY.get(name)
    if modname is None:
        raise AttributeError(f"module 'clusterkernel' has no attribute {name!r}")
    module = importlib.import_module(modname)
    value = module if modname.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


def current_cluster() -> Cluster | None:
    """The :class:`Cluster` that ``%mpi start`` (or ``%mpi attach``, or the MPI kernel)
    gave this session, or None before that and after ``%mpi stop``; a script's own
    ``Cluster(...)`` is not it.

    Example::

        cluster = clusterkernel.current_cluster()   # the one %mpi start made, else None
        if cluster is not None:
            cluster.run("print('hi')")
    """
    from clusterkernel.client import _session

    return _session.cluster()


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%mpi`` / ``%%mpi`` magics (``%load_ext clusterkernel``)."""
    from clusterkernel.client.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from clusterkernel.client.magics import unload_ipython_extension as _unload

    _unload(ipython)
