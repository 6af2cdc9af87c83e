"""The sampler thread of ``%%mpi --profile``, and its fold of frames (rank side).

Part of the rank's sampler (``rank/_profile.py``, which owns the one per rank). A
daemon thread reads ``sys._current_frames()`` ``hz`` times a second and adds the time
since its last look to each sampled stack (wall time: a ``time.sleep`` or a wait in a
collective counts, as it does for the rank's progress). It samples the process's main
thread (the one that runs the cells: ``main``) and the threads the user started, each
under its own name; the kernel's own threads (ipykernel's control and IOPub threads,
the heartbeat, IPython's history saver: a thread whose own code is the kernel's) are
not sampled. The frames of the machinery around the cell (IPython, ipykernel,
ipyparallel, jupyter_client, zmq, tornado, asyncio, threading, clusterkernel's engine
runtime) are folded away, and a user's thread with nothing else on its stack is not
counted. On an engine, the main thread outside a cell (waiting for the next one,
answering the notebook's calls) is sampled with an empty stack: the notebook shows
that time as "between cells", apart from the cells' lines. A cell's frames are named
as the notebook numbers it, ``Cell In[7]`` (``rank/_profile_cells.py``). Each sample
also goes to the rolling window and the snapshot being filled
(``rank/_profile_window.py``).

Example::

    s = Sampler(hz=100).start()
    work()
    data = s.stop()   # {"stacks": [[thread, [[file, line, func], ...], seconds], ...]}
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from clusterkernel.protocol import _ipykernel
from clusterkernel.rank import _profile_cells
from clusterkernel.rank._profile_window import Windows

DEFAULT_HZ = 100
"""Samples per second of the default rate (BENCHMARKS.md: its cost on a busy loop)."""

THREAD_NAME = "clusterkernel-profile"
"""The sampler thread's name (tests look for it; it exists only while a cell is profiled)."""

# Outermost frame of a cell's stack on the main thread: everything further out runs it.
_CELL_RUNNER = "IPython" + os.sep + "core" + os.sep + "interactiveshell.py"
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The kernel's code, folded away on any thread; a thread whose own code (the first
# frame past threading.py) is in it is one of the kernel's threads, not sampled.
_OUR_RUNTIME = tuple(os.path.join(_OURS, d) + os.sep for d in ("rank", "protocol")) + (
    os.path.join(_OURS, "metrics", "_stream.py"),  # the dashboard's stream thread
)
_KERNEL_DIRS = tuple(
    os.sep + name + os.sep
    for name in (
        "ipykernel", "ipyparallel", "IPython", "jupyter_client", "zmq", "tornado", "traitlets",
    )
)  # fmt: skip
# Other machinery folded away: what runs the user's code without being it.
_MACHINERY_DIRS = (os.sep + "asyncio" + os.sep,)
_MACHINERY_FILES = tuple(
    os.sep + name for name in ("selectors.py", "concurrent/futures/thread.py", "runpy.py")
) + ("<frozen runpy>",)  # python -m ipyparallel.engine: else idle time counts as busy
_THREADING = os.sep + "threading.py"

# What a code object is to the sampler (cached per code object)
_OWN, _RUNNER, _KERNEL, _FOLD, _THREAD = range(5)

Frame = tuple[str, int, str]  # (file, line, function)
MAX_RUNS = 200_000
"""Timeline runs kept per cell (a few MB); past it only the totals grow (``truncated``)."""


class Sampler:
    """One profiled cell's sampler thread: ``start()``, the cell, ``stop()`` -> samples.

    Example::

        s = Sampler(hz=100).start()
        work()
        data = s.stop()   # {"stacks": [[thread, [[file, line, func], ...], seconds], ...]}
    """

    def __init__(
        self, hz: float = DEFAULT_HZ, main_ident: int | None = None, every: float | None = None
    ) -> None:
        self.interval = 1.0 / hz
        self.every = every  # seconds per snapshot (None: none cut)
        # the cells run on the main thread, whichever thread starts the sampler
        self.main_ident = threading.main_thread().ident if main_ident is None else main_ident
        # on an engine the main thread also waits for cells and answers the notebook
        self.cells = _ipykernel.kernel_of() is not None
        self.stacks: dict[tuple[str, tuple[Frame, ...]], float] = {}
        self.samples = 0
        # thread -> [[stack index, start, seconds], ...]: consecutive samples of one
        # stack are one run, so a long sleep is one entry, not thousands
        self._index: dict[tuple[str, tuple[Frame, ...]], int] = {}
        self.timeline: dict[str, list[list]] = {}
        self._runs = 0
        self._comm_from: int | None = None
        self._kinds: dict[Any, tuple[int, str]] = {}  # code object -> (_OWN..., file shown)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._t0 = 0.0
        self._t1 = 0.0
        self._wall0 = 0.0
        # the rolling window and the snapshots (every), read by peek()
        self._windows = Windows(every, 1.0 / self.interval, _comm_since)

    def start(self) -> Sampler:
        rec = _recorder()
        self._comm_from = None if rec is None else rec.total("comm")
        self._wall0 = time.time()
        self._t0 = time.perf_counter()
        self._windows.begin(self._t0, self._wall0, self._comm_from)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """End the thread; the sampled stacks (outermost frame first) and the seconds covered."""
        self._done.set()
        self._thread.join()
        self._t1 = time.perf_counter()
        windows = self._windows
        if windows.window is not None and windows.window.samples:
            windows.cut(self._t1, partial=True)  # the last, shorter window
        # stacks in the order of self._index, so the timeline's indices point into them
        return {
            "stacks": [
                [thread, [list(f) for f in stack], round(self.stacks[(thread, stack)], 6)]
                for (thread, stack) in self._index
            ],
            "timeline": self.timeline,
            "truncated": self._runs >= MAX_RUNS,
            "t0": self._t0,
            "wall0": self._wall0,
            "comm": self._comm(),
            "seconds": self._t1 - self._t0,
            "samples": self.samples,
            "hz": 1.0 / self.interval,
            "pid": os.getpid(),
            "every": self.every,
            "snapshots": list(windows.snapshots),
            "snapshots_dropped": windows.dropped,
        }

    def peek(self, window: float | None = None, since: int = -1) -> dict:
        """What the sampler holds now, without stopping it (any thread): the rolling
        ``window`` (the last ``window`` seconds' stacks, None: not asked for) and the
        snapshots after ``since`` (the snapshots up to ``since`` are dropped: the
        notebook has them).

        Example::

            s.peek(window=10, since=-1)   # {"window": {"stacks": [...], ...}, "snapshots": [...]}
        """
        return self._windows.peek(window, since, wall0=self._wall0, running=not self._done.is_set())

    def _comm(self) -> list[list] | None:
        """The comm timing records written during the cell (COMM_FIELDS order)."""
        return _comm_since(self._comm_from, self._t0)[0]

    def _loop(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        windows = self._windows
        while not self._done.wait(self.interval):
            now = time.perf_counter()
            self.sample(now - last, me)
            last = now
            windows.tick(now)
        self.sample(time.perf_counter() - last, me)  # the last stretch, up to stop()

    def sample(self, dt: float, skip: int | None = None) -> None:
        """Add ``dt`` seconds (the time up to now) to every sampled thread's current stack."""
        self.samples += 1
        at = time.perf_counter() - dt
        start = at - self._t0
        names = {t.ident: t.name for t in threading.enumerate()}
        win = self._windows.window
        if win is not None:
            win.samples += 1
        piece = self._windows.slice
        for ident, frame in sys._current_frames().items():
            if ident == skip:
                continue
            main = ident == self.main_ident
            stack = self._stack(frame, main)
            if stack is None or (not stack and not main):
                continue
            thread = "main" if main else names.get(ident, str(ident))
            key = (thread, stack)
            idx = self._index.get(key)
            if idx is None:
                idx = self._index[key] = len(self._index)
                self.stacks[key] = 0.0
            self.stacks[key] += dt
            piece[key] = piece.get(key, 0.0) + dt
            if win is not None:
                win.add(key, at, dt)
            runs = self.timeline.setdefault(thread, [])
            if runs and runs[-1][0] == idx:
                runs[-1][2] += dt
            elif self._runs < MAX_RUNS:
                self._runs += 1
                runs.append([idx, start, dt])

    def _stack(self, frame, main: bool) -> tuple[Frame, ...] | None:
        """``frame``'s stack, outermost first, the machinery folded away; empty for the
        main thread of an engine outside a cell; None for a thread of the kernel's own."""
        out: list[Frame] = []
        kinds = self._kinds
        outer = _OWN  # the kind of the thread's own code (its first frame past threading.py)
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = _kind_of(code.co_filename)
            if kind[0] == _RUNNER and main:
                break  # everything further out runs the cell
            if kind[0] == _OWN:
                out.append((kind[1], frame.f_lineno, code.co_name))
            if kind[0] != _THREAD:
                outer = kind[0]
            frame = frame.f_back
        else:  # no cell runner on the stack
            if main and self.cells:
                return ()  # the engine between cells: waiting, or answering the notebook
        if not main and outer in (_KERNEL, _RUNNER):
            return None
        out.reverse()
        return tuple(out)


def _kind_of(filename: str) -> tuple[int, str]:
    """What code from ``filename`` is to the sampler, and the file shown for it (a
    cell's: the notebook's name of it, ``Cell In[7]``)."""
    if filename.endswith(_CELL_RUNNER):
        return _RUNNER, filename
    if filename.startswith(_OUR_RUNTIME) or any(d in filename for d in _KERNEL_DIRS):
        return _KERNEL, filename
    if filename.endswith(_THREADING):
        return _THREAD, filename
    if filename.endswith(_MACHINERY_FILES) or any(d in filename for d in _MACHINERY_DIRS):
        return _FOLD, filename
    return _OWN, _profile_cells.cell_name(filename) or filename


def _comm_since(start: int | None, t0: float) -> tuple[list[list] | None, int | None]:
    """The comm timing records from ``start`` (the recorder's count then) written at
    ``t0`` or later, and where the next read starts; ``(None, start)`` without a recorder."""
    rec = _recorder()
    if rec is None or start is None:
        return None, start
    items, nxt, _lost = rec.read("comm", start)
    return [list(t) for t in items if t[4] >= t0], nxt


def _recorder():
    """This rank's metrics recorder if one exists (never made here: profiling must not
    start the comm hooks a recorder brings)."""
    metrics = sys.modules.get("clusterkernel.metrics")
    return None if metrics is None else getattr(metrics, "_RECORDER", None)
