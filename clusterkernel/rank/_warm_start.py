"""Start an ipyparallel engine with modules importing beside it (engine side).

``%mpi start --torch`` makes a process group on every rank as soon as the ranks have
registered, and importing torch.distributed is most of that time (about 1 s in one
process here). An engine's own start (its imports, MPI's init, registration with the
controller) leaves the CPU idle while it waits on the controller, so the import runs
beside it in a thread; the group's set-up then finds torch imported, or waits on
Python's import lock for the rest.

ipyparallel runs it as the engine command (``engine_cmd``, see
``clusterkernel.client.cluster._launch.engine_cmd``) with the modules named in
``CLUSTERKERNEL_PREIMPORT``, comma-separated; without it, it is the plain engine.

Example::

    CLUSTERKERNEL_PREIMPORT=torch.distributed python -m clusterkernel.rank._warm_start --mpi
"""

from __future__ import annotations

import importlib
import os
import runpy
import threading

from clusterkernel.protocol._names import PREIMPORT


def _import(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            # not lost: a failed import leaves nothing in sys.modules, so the cell or
            # the group's set-up that imports it again raises the same error where
            # the user sees it
            continue


def main() -> None:
    names = [n for n in os.environ.pop(PREIMPORT, "").split(",") if n.strip()]
    if names:
        threading.Thread(
            target=_import, args=([n.strip() for n in names],), name="preimport", daemon=True
        ).start()
    runpy.run_module("ipyparallel.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
