"""Sample this rank's Python stacks while a cell runs (rank side; ``%%mpi --profile``).

A daemon thread reads ``sys._current_frames()`` ``hz`` times a second and adds the
time since its last look to each sampled stack (wall time: a ``time.sleep`` or a wait
in a collective counts, as it does for the rank's progress). It samples the thread
that runs the cell and the threads the user started; the frames of the machinery
around the cell (IPython, ipykernel, ipyparallel, zmq, tornado, asyncio, threading,
clusterkernel's engine runtime) are folded away, and a thread with nothing else on
its stack is not counted. Nothing runs between profiled cells: :func:`stop` ends the
thread, and without ``--profile`` no thread is started.

The measured choice over pyinstrument is in BENCHMARKS.md ("Profiling every rank").

The notebook calls these by name (``clusterkernel.protocol._rank_call``)::

    rank_call("clusterkernel.rank._profile:start", hz=100)
    ...  # the cell runs
    rank_call("clusterkernel.rank._profile:stop")   # {"stacks": [...], "seconds": ...}
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

DEFAULT_HZ = 100
"""Samples per second of the default rate (BENCHMARKS.md: its cost on a busy loop)."""

THREAD_NAME = "clusterkernel-profile"
"""The sampler thread's name (tests look for it; it exists only while a cell is profiled)."""

# Outermost frame of a cell's stack on the main thread: everything further out runs it.
_CELL_RUNNER = "IPython" + os.sep + "core" + os.sep + "interactiveshell.py"
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames folded away on any thread: the machinery around the user's code.
_OUR_RUNTIME = tuple(os.path.join(_OURS, d) + os.sep for d in ("rank", "protocol")) + (
    os.path.join(_OURS, "metrics", "_stream.py"),  # the dashboard's stream thread
)
_MACHINERY_DIRS = tuple(
    os.sep + name + os.sep
    for name in ("ipykernel", "ipyparallel", "IPython", "zmq", "tornado", "traitlets", "asyncio")
)
_MACHINERY_FILES = tuple(
    os.sep + name for name in ("threading.py", "selectors.py", "concurrent/futures/thread.py")
)

Frame = tuple[str, int, str]  # (file, line, function)


class Sampler:
    """One profiled cell's sampler thread: ``start()``, the cell, ``stop()`` -> samples.

    Example::

        s = Sampler(hz=100).start()
        work()
        data = s.stop()   # {"stacks": [[thread, [[file, line, func], ...], seconds], ...]}
    """

    def __init__(self, hz: float = DEFAULT_HZ, main_ident: int | None = None) -> None:
        self.interval = 1.0 / hz
        self.main_ident = threading.get_ident() if main_ident is None else main_ident
        self.stacks: dict[tuple[str, tuple[Frame, ...]], float] = {}
        self.samples = 0
        self._folded: dict[Any, bool] = {}  # code object -> machinery?
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._t0 = 0.0
        self._t1 = 0.0

    def start(self) -> Sampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """End the thread; the sampled stacks (outermost frame first) and the seconds covered."""
        self._done.set()
        self._thread.join()
        self._t1 = time.perf_counter()
        return {
            "stacks": [
                [thread, [list(f) for f in stack], round(secs, 6)]
                for (thread, stack), secs in self.stacks.items()
            ],
            "seconds": self._t1 - self._t0,
            "samples": self.samples,
            "hz": 1.0 / self.interval,
            "pid": os.getpid(),
        }

    def _loop(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self._done.wait(self.interval):
            now = time.perf_counter()
            self.sample(now - last, me)
            last = now
        self.sample(time.perf_counter() - last, me)  # the last stretch, up to stop()

    def sample(self, dt: float, skip: int | None = None) -> None:
        """Add ``dt`` seconds to every sampled thread's current stack."""
        self.samples += 1
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == skip:
                continue
            main = ident == self.main_ident
            stack = self._stack(frame, main)
            if not stack and not main:
                continue
            key = ("main" if main else names.get(ident, str(ident)), stack)
            self.stacks[key] = self.stacks.get(key, 0.0) + dt

    def _stack(self, frame, main: bool) -> tuple[Frame, ...]:
        out: list[Frame] = []
        folded = self._folded
        while frame is not None:
            code = frame.f_code
            fold = folded.get(code)
            if fold is None:
                name = code.co_filename
                fold = folded[code] = (
                    name.startswith(_OUR_RUNTIME)
                    or name.endswith(_MACHINERY_FILES)
                    or any(d in name for d in _MACHINERY_DIRS)
                )
            if main and code.co_filename.endswith(_CELL_RUNNER):
                break  # everything further out runs the cell
            if not fold:
                out.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        out.reverse()
        return tuple(out)


_current: Sampler | None = None


def start(hz: float = DEFAULT_HZ) -> bool:
    """Start sampling this rank (called on the thread that will run the cell).

    A sampler left from a cell whose ``stop`` never came is replaced.

    Example::

        rank_call("clusterkernel.rank._profile:start", hz=100)
    """
    global _current
    if _current is not None:
        _current.stop()
    _current = Sampler(hz=hz).start()
    return True


def stop() -> dict | None:
    """Stop sampling; this rank's profile (``Sampler.stop``), or None when none ran.

    Example::

        rank_call("clusterkernel.rank._profile:stop")["seconds"]
    """
    global _current
    sampler, _current = _current, None
    return None if sampler is None else sampler.stop()


def running() -> bool:
    """Whether a sampler thread runs on this rank now (none between profiled cells).

    Example::

        rank_call("clusterkernel.rank._profile:running")   # False
    """
    return any(t.name == THREAD_NAME for t in threading.enumerate())
