"""Each cell an engine runs is a run of its own in the recorder (rank side).

The recorder marks the start of each cell (:meth:`Recorder.mark_cell
<clusterkernel.metrics.Recorder.mark_cell>`) from an IPython ``pre_run_cell`` hook, so
the dashboard draws one run per cell. The cell's name is the label ``%%mpi`` gave it,
the same on every rank. Nothing is hooked outside an IPython kernel (a job under plain
``mpiexec``: one run) nor before the engine's kernel exists (a recorder made by an
import that runs before the engine starts, such as the warm start's ``comm``): the
engine's set-up then hooks it (``metrics._follow_engine_cells``).

Example::

    follow(metrics.recorder())     # on an engine: once; later calls do nothing
"""

from __future__ import annotations

import sys
from typing import Any

from clusterkernel.protocol._ipykernel import running_request
from clusterkernel.protocol.records import CELL_LABEL

_following = False  # a recorder is hooked to this engine's cells


def cell_name(shell: Any) -> str:
    """The cell this engine runs now: the label ``%%mpi`` gave it (the same on every
    rank), else the engine's execution count (a cell sent some other way)."""
    try:
        label = (running_request(shell.kernel).get("metadata") or {}).get("label")
    except Exception:
        label = None
    if isinstance(label, str) and label.startswith(CELL_LABEL):
        return label
    return f"cell {shell.execution_count}"


def _hook(rec: Any) -> bool:
    """Mark each cell the engine runs in ``rec``; True once hooked (False: no kernel yet)."""
    ipython = sys.modules.get("IPython")  # loaded on every engine; never imported here
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    shell.events.register("pre_run_cell", lambda info=None: rec.mark_cell(cell_name(shell)))
    try:
        running = running_request(shell.kernel).get("header", {}).get("msg_type")
    except Exception:
        running = None
    if running == "execute_request":  # made inside a cell: that cell has begun
        rec.mark_cell(cell_name(shell))
    return True


def follow(rec: Any) -> None:
    """Hook ``rec`` to the engine's cells, once (nothing where no kernel runs yet)."""
    global _following
    if _following:
        return
    try:
        _following = _hook(rec)
    except Exception:  # an unusual shell: records then form one run
        pass
