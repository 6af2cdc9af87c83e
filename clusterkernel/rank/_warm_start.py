"""Start an ipyparallel engine with what its first cell will need loaded first (engine side).

What every notebook's first cell imports costs seconds: ``from clusterkernel import
comm`` loads torch and mpi4py's ``MPI``, ``%mpi start --torch`` makes a process group that
imports torch.distributed, and the first Tab loads jedi. Here they load before the
engine starts, on its main thread, so the first cell finds everything imported
(BENCHMARKS.md, "The first cell after start"). Not in a thread beside the engine's
start: an import there raced the engine's own (debugpy walks ``sys.modules`` while it
loads), and a rank died before it registered.

MPI itself is initialised on the main thread first, as the engine would do it a moment
later: the thread that initialises MPI is its main thread. Rank 0, which answers Tab
by default, also loads jedi (:func:`clusterkernel.rank._completion.load_jedi`). On a
host with more than four ranks per core nothing else is imported (:func:`_crowded`).

ipyparallel runs it as the engine command (``engine_cmd``, see
``clusterkernel.client.launch._engine_set.engine_cmd``) with the modules named in
``CLUSTERKERNEL_PREIMPORT``, comma-separated (``clusterkernel.comm`` unless the cluster's
``env`` sets the variable; ``""`` starts the plain engine).

Example::

    CLUSTERKERNEL_PREIMPORT=clusterkernel.comm python -m clusterkernel.rank._warm_start --mpi
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

from clusterkernel.protocol._names import PREIMPORT

# the ranks on this host, as Open MPI, MPICH and PMIx tell a rank
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE")
_PER_CORE = 4


def _import(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            # not lost: a failed import leaves nothing in sys.modules, so the cell or
            # the group's set-up that imports it again raises the same error where
            # the user sees it
            continue


def _warm(names: list[str], completer: bool) -> None:
    _import(names)
    if completer:
        try:
            from clusterkernel.rank import _completion

            _completion.load_jedi()
        except Exception:  # the first Tab then loads it, as without the warm-up
            pass


def _rank() -> int | None:
    """This process's MPI rank, MPI initialised here on the main thread; None when the
    engine is not an MPI one."""
    if "--mpi" not in sys.argv[1:]:
        return None
    from clusterkernel.rank._world import world  # a respawned rank's world is set by now

    return world().Get_rank()


def _crowded() -> bool:
    """More ranks on this host than ``_PER_CORE`` per core: the engines' start leaves no
    CPU idle, and importing beside it makes the start longer by more than the first
    cell gains (BENCHMARKS.md, "The first cell after start": 16 ranks on two cores)."""
    local = next((os.environ[k] for k in _LOCAL_SIZE if os.environ.get(k, "").isdigit()), "")
    return bool(local) and int(local) > _PER_CORE * (os.cpu_count() or 1)


def main() -> None:
    names = [n.strip() for n in os.environ.pop(PREIMPORT, "").split(",") if n.strip()]
    if _crowded():
        names = []
    rank = _rank()
    # On the main thread, before the engine starts: imported in a thread beside the
    # engine's own start, the import of ipykernel's Debugger (debugpy walks sys.modules
    # while it loads) saw the dict change under it, and that rank never registered.
    _warm(names, rank == 0)
    runpy.run_module("ipyparallel.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
