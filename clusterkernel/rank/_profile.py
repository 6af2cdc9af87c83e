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

**While the cell runs** (the dashboard's profile panel, ``%mpi profile start --every 60s``)
the sampler thread also keeps, at no extra wake-ups of its own:

- a **rolling window**: the stacks' seconds in one-second slices, the last
  :data:`ROLLING_SLICES` of them (totals only: the panel shows top lines and the
  straggler's difference, which need no time order);
- with ``every``: a **snapshot** of each ``every`` seconds, cut by the sampler thread
  itself at the window's end (the same dict as :meth:`Sampler.stop`'s, over that window,
  so it exports like a whole profile; its timeline capped at :data:`SNAPSHOT_RUNS`),
  held on the rank until the notebook says it has it (at most :data:`MAX_SNAPSHOTS`,
  the oldest dropped and counted past that).

The notebook reads both with :data:`PROFILE_PEEK` on the **control channel**, which
ipykernel's control thread answers while the cell keeps the main thread busy (the
same way :data:`PROFILE_REQUEST` collects a hung cell's samples). Why pull on the
control channel rather than push on the dashboard's metric stream: the stream exists
only while a dashboard is open, and ``cluster.profile("snapshots")`` must work from a
script without one; a queued ``rank_call`` would wait for the cell to end; and the rank
cuts its windows itself, so their edges do not depend on when the notebook asks (a
notebook busy for a minute loses nothing, its next pull takes every snapshot since).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
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
    os.sep + name
    for name in ("threading.py", "selectors.py", "concurrent/futures/thread.py", "runpy.py")
) + ("<frozen runpy>",)  # python -m ipyparallel.engine: else idle time counts as busy

Frame = tuple[str, int, str]  # (file, line, function)
MAX_RUNS = 200_000
"""Timeline runs kept per cell (a few MB); past it only the totals grow (``truncated``)."""
SNAPSHOT_RUNS = 20_000
"""Timeline runs kept per snapshot (``every``); past it only its totals grow."""
MAX_SNAPSHOTS = 100
"""Snapshots a rank holds that the notebook has not taken yet; past it the oldest go."""
ROLLING_SLICE = 1.0
"""Seconds per slice of the rolling window."""
ROLLING_SLICES = 120
"""Slices kept: the rolling window reaches back this many slices (two minutes)."""


class _Window:
    """The stacks and timeline of one snapshot's window (``every``); starts at ``t0``
    (``perf_counter``), its timeline's starts counted from there."""

    __slots__ = ("t0", "wall0", "index", "secs", "timeline", "runs", "samples", "comm_from")

    def __init__(self, t0: float, wall0: float, comm_from: int | None) -> None:
        self.t0, self.wall0, self.comm_from = t0, wall0, comm_from
        self.index: dict[tuple[str, tuple[Frame, ...]], int] = {}
        self.secs: list[float] = []
        self.timeline: dict[str, list[list]] = {}
        self.runs = 0
        self.samples = 0

    def add(self, key: tuple[str, tuple[Frame, ...]], at: float, dt: float) -> None:
        idx = self.index.get(key)
        if idx is None:
            idx = self.index[key] = len(self.secs)
            self.secs.append(0.0)
        self.secs[idx] += dt
        runs = self.timeline.setdefault(key[0], [])
        if runs and runs[-1][0] == idx:
            runs[-1][2] += dt
        elif self.runs < SNAPSHOT_RUNS:
            self.runs += 1
            runs.append([idx, at - self.t0, dt])


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
        # rolling window: finished one-second slices, the current one, its end
        self._slices: deque[tuple[float, dict]] = deque(maxlen=ROLLING_SLICES)
        self._slice: dict = {}
        self._slice_t0 = 0.0
        self._slice_end = 0.0
        # snapshots (every): the window being filled, the cut ones not yet taken
        self._window: _Window | None = None
        self.snapshots: deque[dict] = deque()
        self.dropped = 0  # snapshots dropped unread (MAX_SNAPSHOTS)
        self._seq = 0
        self._lock = threading.Lock()  # the slices and snapshots, read by peek()

    def start(self) -> Sampler:
        rec = _recorder()
        self._comm_from = None if rec is None else rec.total("comm")
        self._wall0 = time.time()
        self._t0 = time.perf_counter()
        self._slice_t0, self._slice_end = self._t0, self._t0 + ROLLING_SLICE
        if self.every:
            self._window = _Window(self._t0, self._wall0, self._comm_from)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """End the thread; the sampled stacks (outermost frame first) and the seconds covered."""
        self._done.set()
        self._thread.join()
        self._t1 = time.perf_counter()
        if self._window is not None and self._window.samples:
            self._cut(self._t1, partial=True)  # the last, shorter window
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
            "snapshots": list(self.snapshots),
            "snapshots_dropped": self.dropped,
        }

    # ---------------------------------------------------------------- windows
    def _cut(self, now: float, partial: bool = False) -> None:
        """End the current snapshot window at ``now`` (on the sampler thread, or in
        stop() once it has ended) and begin the next."""
        win = self._window
        assert win is not None
        keys = list(win.index)
        comm, nxt = None, win.comm_from
        rec = _recorder()
        if rec is not None and win.comm_from is not None:
            items, nxt, _lost = rec.read("comm", win.comm_from)
            comm = [list(t) for t in items if t[4] >= win.t0]
        snap = {
            "stacks": [
                [thread, [list(f) for f in stack], round(win.secs[i], 6)]
                for i, (thread, stack) in enumerate(keys)
            ],
            "timeline": win.timeline,
            "truncated": win.runs >= SNAPSHOT_RUNS,
            "t0": win.t0,
            "wall0": win.wall0,
            "comm": comm,
            "seconds": now - win.t0,
            "samples": win.samples,
            "hz": 1.0 / self.interval,
            "pid": os.getpid(),
            "seq": self._seq,
            "partial": partial,
        }
        self._seq += 1
        self._window = _Window(now, win.wall0 + (now - win.t0), nxt)
        with self._lock:
            self.snapshots.append(snap)
            while len(self.snapshots) > MAX_SNAPSHOTS:
                self.snapshots.popleft()
                self.dropped += 1

    def peek(self, window: float | None = None, since: int = -1) -> dict:
        """What the sampler holds now, without stopping it (any thread): the rolling
        ``window`` (the last ``window`` seconds' stacks, None: not asked for) and the
        snapshots after ``since`` (the snapshots up to ``since`` are dropped: the
        notebook has them).

        Example::

            s.peek(window=10, since=-1)   # {"window": {"stacks": [...], ...}, "snapshots": [...]}
        """
        with self._lock:
            while self.snapshots and self.snapshots[0]["seq"] <= since:
                self.snapshots.popleft()
            snaps = list(self.snapshots)
            slices = list(self._slices)
            current = self._slice.copy()  # atomic under the GIL: the thread goes on adding
            slice_t0 = self._slice_t0
        out: dict[str, Any] = {
            "snapshots": snaps,
            "dropped": self.dropped,
            "pid": os.getpid(),
            "wall0": self._wall0,
            "every": self.every,
            "running": not self._done.is_set(),
        }
        if window is not None:
            # the finished slices that end within the window, and the current one
            now = time.perf_counter()
            parts = [(t, d) for t, d in slices if t >= now - window - ROLLING_SLICE / 2]
            parts.append((slice_t0, current))
            total: dict[tuple, float] = {}
            for _t, part in parts:
                for key, secs in part.items():
                    total[key] = total.get(key, 0.0) + secs
            out["window"] = {
                "stacks": [[t, [list(f) for f in st], round(v, 6)] for (t, st), v in total.items()],
                "seconds": max(now - parts[0][0], 0.0),
                "end": time.time(),
                "pid": os.getpid(),
            }
        return out

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
            if now >= self._slice_end:
                self._next_slice(now)
            win = self._window
            if win is not None and now - win.t0 >= self.every:
                self._cut(now)
        self.sample(time.perf_counter() - last, me)  # the last stretch, up to stop()

    def _next_slice(self, now: float) -> None:
        with self._lock:
            self._slices.append((self._slice_t0, self._slice))
            self._slice, self._slice_t0 = {}, now
        self._slice_end = now + ROLLING_SLICE

    def sample(self, dt: float, skip: int | None = None) -> None:
        """Add ``dt`` seconds (the time up to now) to every sampled thread's current stack."""
        self.samples += 1
        at = time.perf_counter() - dt
        start = at - self._t0
        names = {t.ident: t.name for t in threading.enumerate()}
        win = self._window
        if win is not None:
            win.samples += 1
        piece = self._slice
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
            piece[key] = piece.get(key, 0.0) + dt
            if win is not None:
                win.add(key, at, dt)
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
PROFILE_PEEK = "clusterkernel_profile_peek"
"""A control-channel request answered with :func:`peek` (content: its keywords), the
sampler left running: the rolling window and snapshots while a cell runs."""
PEEK_REPLY = "clusterkernel_profile_peek_reply"


def _install_control_handler() -> None:
    # an engine has IPython loaded already; an exported batch job has none to load
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    kernel = getattr(ipython.get_ipython(), "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None or PROFILE_PEEK in handlers:
        return

    def answer(stream, ident, parent) -> None:
        try:
            reply = {"status": "ok", "profile": stop()}
        except Exception as e:  # reply anyway: the notebook waits for it
            reply = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, PROFILE_REPLY, reply, parent, ident)

    def answer_peek(stream, ident, parent) -> None:
        content = parent.get("content") or {}
        try:
            reply = {"status": "ok", **peek(content.get("window"), content.get("since", -1))}
        except Exception as e:  # reply anyway: the notebook's poller waits for it
            reply = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, PEEK_REPLY, reply, parent, ident)

    handlers[PROFILE_REQUEST] = answer
    handlers[PROFILE_PEEK] = answer_peek


def start(hz: float = DEFAULT_HZ, torch: bool = False, every: float | None = None) -> int:
    """Start sampling this rank (called on the thread that will run the cell);
    ``torch``: also torch.profiler's CPU ops (``--profile torch``); ``every``: cut a
    snapshot every so many seconds (:func:`peek` hands them out). Returns this
    process's pid (the notebook tells a rank restarted since by it).

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
