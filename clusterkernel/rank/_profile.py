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

Besides the stacks' totals, a profile holds each thread's **timeline** (runs of
samples with the same stack, for the Chrome trace and speedscope's time order),
the clock (``wall0``: ``time.time()`` at the start, ``t0``: ``perf_counter()``), and
the comm layer's timing records of the cell (``clusterkernel.metrics``, only where a
recorder already exists: the notebook splits time in collectives into moving data
and waiting for other ranks from them).

A job exported with ``--profile`` (``clusterkernel.client.export``) calls :func:`start`
at its top and :func:`gather` at its end, on every rank, with no notebook around.
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
MAX_RUNS = 200_000
"""Timeline runs kept per cell (a few MB); past it only the totals grow (``truncated``)."""


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
        # thread -> [[stack index, start, seconds], ...]: consecutive samples of one
        # stack are one run, so a long sleep is one entry, not thousands
        self._index: dict[tuple[str, tuple[Frame, ...]], int] = {}
        self.timeline: dict[str, list[list]] = {}
        self._runs = 0
        self._comm_from: int | None = None
        self._folded: dict[Any, bool] = {}  # code object -> machinery?
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._t0 = 0.0
        self._t1 = 0.0
        self._wall0 = 0.0

    def start(self) -> Sampler:
        rec = _recorder()
        self._comm_from = None if rec is None else rec.total("comm")
        self._wall0 = time.time()
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """End the thread; the sampled stacks (outermost frame first) and the seconds covered."""
        self._done.set()
        self._thread.join()
        self._t1 = time.perf_counter()
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
        }

    def _comm(self) -> list[list] | None:
        """The comm timing records written during the cell (COMM_FIELDS order)."""
        rec = _recorder()
        if rec is None or self._comm_from is None:
            return None
        items, _next, _lost = rec.read("comm", self._comm_from)
        return [list(t) for t in items if t[4] >= self._t0]

    def _loop(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self._done.wait(self.interval):
            now = time.perf_counter()
            self.sample(now - last, me)
            last = now
        self.sample(time.perf_counter() - last, me)  # the last stretch, up to stop()

    def sample(self, dt: float, skip: int | None = None) -> None:
        """Add ``dt`` seconds (the time up to now) to every sampled thread's current stack."""
        self.samples += 1
        start = time.perf_counter() - dt - self._t0
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == skip:
                continue
            main = ident == self.main_ident
            stack = self._stack(frame, main)
            if not stack and not main:
                continue
            thread = "main" if main else names.get(ident, str(ident))
            key = (thread, stack)
            idx = self._index.get(key)
            if idx is None:
                idx = self._index[key] = len(self._index)
                self.stacks[key] = 0.0
            self.stacks[key] += dt
            runs = self.timeline.setdefault(thread, [])
            if runs and runs[-1][0] == idx:
                runs[-1][2] += dt
            elif self._runs < MAX_RUNS:
                self._runs += 1
                runs.append([idx, start, dt])

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


def _recorder():
    """This rank's metrics recorder if one exists (never made here: profiling must not
    start the comm hooks a recorder brings)."""
    metrics = sys.modules.get("clusterkernel.metrics")
    return None if metrics is None else getattr(metrics, "_RECORDER", None)


MAX_TORCH_EVENTS = 200_000
"""torch ops kept per cell (``--profile torch``); the rest are counted in ``torch_dropped``."""


class _TorchOps:
    """torch.profiler (CPU ops; CUDA kernels on a GPU rank) around a cell; its events
    on the wall clock in us (kineto counts ``ts`` from ``baseTimeNanoseconds``)."""

    def __init__(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():  # CUDA kernels too on a GPU rank (not run on CI: no GPU)
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        self._prof.start()

    def stop(self) -> tuple[list[dict], int]:
        import json
        import tempfile

        self._prof.stop()
        fd, path = tempfile.mkstemp(suffix=".json", prefix="ck-torch-")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                doc = json.load(f)
        finally:
            os.unlink(path)
        # kineto counts ts (us) from baseTimeNanoseconds: their sum is the wall clock
        base = doc.get("baseTimeNanoseconds", 0) / 1e3
        events = [
            {
                "ph": "X",
                "name": e["name"],
                "cat": e.get("cat", "torch"),
                "ts": e["ts"] + base,
                "dur": e.get("dur", 0.0),
            }
            for e in doc.get("traceEvents", [])
            if e.get("ph") == "X" and "ts" in e and e.get("cat") != "Trace"  # kineto's own span
        ]
        return events[:MAX_TORCH_EVENTS], max(0, len(events) - MAX_TORCH_EVENTS)


_current: Sampler | None = None
_torch: _TorchOps | None = None

PROFILE_REQUEST = "clusterkernel_profile_request"
"""A control-channel request that stops the sampler and replies with the profile:
answered by ipykernel's control thread while the cell still runs (a hang under
``--timeout``), so what was sampled comes back before the rank is freed or restarted."""
PROFILE_REPLY = "clusterkernel_profile_reply"


def _install_control_handler() -> None:
    # an engine has IPython loaded already; an exported batch job has none to load
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    kernel = getattr(ipython.get_ipython(), "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None or PROFILE_REQUEST in handlers:
        return

    def answer(stream, ident, parent) -> None:
        try:
            reply = {"status": "ok", "profile": stop()}
        except Exception as e:  # reply anyway: the notebook waits for it
            reply = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, PROFILE_REPLY, reply, parent, ident)

    handlers[PROFILE_REQUEST] = answer


def start(hz: float = DEFAULT_HZ, torch: bool = False) -> bool:
    """Start sampling this rank (called on the thread that will run the cell);
    ``torch``: also torch.profiler's CPU ops (``--profile torch``).

    A sampler left from a cell whose ``stop`` never came is replaced.

    Example::

        rank_call("clusterkernel.rank._profile:start", hz=100)
    """
    global _current, _torch
    if _current is not None:
        stop()
    _install_control_handler()
    # torch.profiler first: its start imports and sets up for a second or more, which
    # is not the cell's time
    _torch = _TorchOps() if torch else None
    _current = Sampler(hz=hz).start()
    return True


def stop() -> dict | None:
    """Stop sampling; this rank's profile (``Sampler.stop``), or None when none ran.

    Example::

        rank_call("clusterkernel.rank._profile:stop")["seconds"]
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

        rank_call("clusterkernel.rank._profile:running")   # False
    """
    return any(t.name == THREAD_NAME for t in threading.enumerate())
