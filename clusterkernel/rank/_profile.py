"""Sample this rank's Python stacks while a cell runs (rank side; ``%%mpi --profile``).

This module owns the one sampler of a rank and is what the notebook and exported jobs
call; the work is in named parts, each re-exported here:

- ``_profile_sampler.py``: the sampler thread and its fold of frames (:class:`Sampler`:
  the stacks' wall time, the machinery around the cell folded away);
- ``_profile_window.py``: the rolling window and periodic snapshots while the cell runs;
- ``_profile_control.py``: the control-channel requests the notebook pulls through
  (:data:`PROFILE_REQUEST`, :data:`PROFILE_PEEK`), answered while the cell runs;
- ``_profile_torch.py``: torch.profiler's ops around the cell (``--profile torch``);
- ``_profile_cells.py``: each cell's name as the notebook numbers it (``Cell In[7]``).

Nothing runs between profiled cells: :func:`stop` ends the thread, and without
``--profile`` no thread is started.

The measured choice over pyinstrument is in BENCHMARKS.md ("Profile").

The notebook calls these by name (``clusterkernel.protocol._targets``)::

    rank_call(PROFILE_START, hz=100)
    ...  # the cell runs
    rank_call(PROFILE_STOP)   # {"stacks": [...], "seconds": ...}

Besides the stacks' totals, a profile holds each thread's **timeline** (runs of
samples with the same stack, for the Chrome trace and speedscope's time order),
the clock (``wall0``: ``time.time()`` at the start, ``t0``: ``perf_counter()``), and
the comm layer's timing records of the cell (``clusterkernel.metrics``, only where a
recorder already exists: the notebook splits time in collectives into moving data
and waiting for other ranks from them).

A job exported with ``--profile`` (``clusterkernel.client.export``) calls :func:`start`
at its top and :func:`gather` at its end, on every rank, with no notebook around.

**While the cell runs** (the dashboard's profile panel, ``%mpi profile start --every 60s``)
the sampler thread also keeps a rolling window of the last seconds and, with ``every``,
a snapshot of each ``every`` seconds (``_profile_window.py``); the notebook reads both
with :data:`PROFILE_PEEK` on the control channel (``_profile_control.py`` says why the
control channel).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from clusterkernel.rank import _profile_cells, _profile_control
from clusterkernel.rank._profile_control import (
    PEEK_REPLY,
    PROFILE_PEEK,
    PROFILE_REPLY,
    PROFILE_REQUEST,
)
from clusterkernel.rank._profile_sampler import DEFAULT_HZ, MAX_RUNS, THREAD_NAME, Frame, Sampler
from clusterkernel.rank._profile_torch import MAX_TORCH_EVENTS, _TorchOps
from clusterkernel.rank._profile_window import (
    MAX_SNAPSHOTS,
    ROLLING_SLICE,
    ROLLING_SLICES,
    SNAPSHOT_RUNS,
)

__all__ = [
    "DEFAULT_HZ",
    "MAX_RUNS",
    "MAX_SNAPSHOTS",
    "MAX_TORCH_EVENTS",
    "PEEK_REPLY",
    "PROFILE_PEEK",
    "PROFILE_REPLY",
    "PROFILE_REQUEST",
    "ROLLING_SLICE",
    "ROLLING_SLICES",
    "SNAPSHOT_RUNS",
    "THREAD_NAME",
    "Frame",
    "Sampler",
    "gather",
    "peek",
    "running",
    "start",
    "stop",
]

_current: Sampler | None = None
_torch: _TorchOps | None = None


def start(hz: float = DEFAULT_HZ, torch: bool = False, every: float | None = None) -> int:
    """Start sampling this rank (called on the thread that will run the cell);
    ``torch``: also torch.profiler's CPU ops (``--profile torch``); ``every``: cut a
    snapshot every so many seconds (:func:`peek` hands them out). Returns this
    process's pid (the notebook tells a rank restarted since by it).

    A sampler left from a cell whose ``stop`` never came is replaced.

    Example::

        start(hz=100)   # the notebook: rank_call(PROFILE_START, hz=100)
    """
    global _current, _torch
    if _current is not None:
        stop()
    _profile_control.install(stop, peek)  # the notebook's pulls while a cell runs
    _profile_cells.follow()  # armed at the engine's start; here too, should that have missed
    # torch.profiler first: its start imports and sets up for a second or more, which
    # is not the cell's time
    _torch = _TorchOps() if torch else None
    _current = Sampler(hz=hz, every=every).start()
    return os.getpid()


def peek(window: float | None = None, since: int = -1) -> dict:
    """The running sampler's rolling window and new snapshots (:meth:`Sampler.peek`),
    or ``{"running": False}`` when none runs; it is left running.

    Example::

        peek(window=10)["window"]["stacks"]   # the last 10 s, as stop()'s "stacks"
    """
    sampler = _current
    if sampler is None:
        return {"running": False, "snapshots": [], "pid": os.getpid()}
    return sampler.peek(window, since)


def stop() -> dict | None:
    """Stop sampling; this rank's profile (``Sampler.stop``), or None when none ran.

    Example::

        stop()["seconds"]   # the notebook: rank_call(PROFILE_STOP)
    """
    global _current, _torch
    sampler, _current = _current, None
    ops, _torch = _torch, None
    data = None if sampler is None else sampler.stop()
    if ops is not None and data is not None:
        try:
            data["torch"], data["torch_dropped"] = ops.stop()
        except Exception as e:  # the samples still come back
            data["torch_error"] = f"{type(e).__name__}: {e}"
    return data


def gather(comm: Any) -> dict[int, dict] | None:
    """Stop this rank's sampler and gather every rank's profile on rank 0 of ``comm``
    (an mpi4py communicator): ``{rank: profile}`` there, None on the others. The end of
    an exported job run with ``--profile``; every rank of ``comm`` must call it. A rank
    whose sampler never started is left out.

    Example::

        ranks = gather(MPI.COMM_WORLD)   # rank 0: {0: {...}, 1: {...}}
    """
    everyone = comm.gather(stop(), root=0)
    if everyone is None:
        return None
    return {rank: data for rank, data in enumerate(everyone) if data is not None}


def running() -> bool:
    """Whether a sampler thread runs on this rank now (none between profiled cells).

    Example::

        running()   # False; the notebook: rank_call(PROFILE_RUNNING)
    """
    return any(t.name == THREAD_NAME for t in threading.enumerate())
