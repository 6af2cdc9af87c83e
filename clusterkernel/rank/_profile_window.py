"""The sampler's view of the running cell: its rolling window and periodic snapshots.

Part of the rank's sampler (``rank/_profile.py``); the sampler thread
(``rank/_profile_sampler.py``) adds each sample here too, at no extra wake-ups of its
own, and :class:`Windows` keeps:

- a **rolling window**: the stacks' seconds in one-second slices, the last
  :data:`ROLLING_SLICES` of them (totals only: the panel shows top lines and the
  straggler's difference, which need no time order);
- with ``every``: a **snapshot** of each ``every`` seconds, cut by the sampler thread
  itself at the window's end (the same dict as ``Sampler.stop``'s, over that window,
  so it exports like a whole profile; its timeline capped at :data:`SNAPSHOT_RUNS`),
  held on the rank until the notebook says it has it (at most :data:`MAX_SNAPSHOTS`,
  the oldest dropped and counted past that).

:meth:`Windows.peek` hands both out from any thread (the control thread, while the
cell keeps the main thread busy: ``rank/_profile_control.py``).

Example::

    w = Windows(every=60.0, hz=100.0, read_comm=lambda start, t0: (None, start))
    w.begin(time.perf_counter(), time.time(), None)
    ...  # the sampler thread: w.slice / w.window get each sample, w.tick(now) after it
    w.peek(window=10, wall0=wall0, running=True)["window"]["stacks"]
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterkernel.rank._profile_sampler import Frame

SNAPSHOT_RUNS = 20_000
"""Timeline runs kept per snapshot (``every``); past it only its totals grow."""
MAX_SNAPSHOTS = 100
"""Snapshots a rank holds that the notebook has not taken yet; past it the oldest go."""
ROLLING_SLICE = 1.0
"""Seconds per slice of the rolling window."""
ROLLING_SLICES = 120
"""Slices kept: the rolling window reaches back this many slices (two minutes)."""

# (records start, t0) -> (the comm records since then or None, where the next read starts)
CommReader = Callable[[Any, float], tuple[Any, Any]]


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


class Windows:
    """One sampler's rolling window and snapshots (``every`` seconds each, None: none).

    The sampler thread adds each sample to :attr:`slice` (the rolling window's current
    slice) and :attr:`window` (the snapshot being filled, None without ``every``), then
    calls :meth:`tick`; :meth:`peek` reads them from any thread.

    Example::

        w = Windows(every=None, hz=100.0, read_comm=lambda start, t0: (None, start))
        w.begin(time.perf_counter(), time.time(), None)
        w.peek(window=10, wall0=0.0, running=True)["window"]["seconds"]
    """

    def __init__(self, every: float | None, hz: float, read_comm: CommReader) -> None:
        self.every = every
        self._hz = hz
        self._read_comm = read_comm
        # rolling window: finished one-second slices, the current one, its end
        self._slices: deque[tuple[float, dict]] = deque(maxlen=ROLLING_SLICES)
        self.slice: dict = {}
        self._slice_t0 = 0.0
        self._slice_end = 0.0
        # snapshots (every): the window being filled, the cut ones not yet taken
        self.window: _Window | None = None
        self.snapshots: deque[dict] = deque()
        self.dropped = 0  # snapshots dropped unread (MAX_SNAPSHOTS)
        self._seq = 0
        self._lock = threading.Lock()  # the slices and snapshots, read by peek()

    def begin(self, t0: float, wall0: float, comm_from: int | None) -> None:
        """Start the first slice (and, with ``every``, the first snapshot) at ``t0``."""
        self._slice_t0, self._slice_end = t0, t0 + ROLLING_SLICE
        if self.every:
            self.window = _Window(t0, wall0, comm_from)

    def tick(self, now: float) -> None:
        """After a sample (sampler thread): begin the next slice or cut a snapshot when due."""
        if now >= self._slice_end:
            self._next_slice(now)
        win = self.window
        if win is not None and now - win.t0 >= self.every:
            self.cut(now)

    def _next_slice(self, now: float) -> None:
        with self._lock:
            self._slices.append((self._slice_t0, self.slice))
            self.slice, self._slice_t0 = {}, now
        self._slice_end = now + ROLLING_SLICE

    def cut(self, now: float, partial: bool = False) -> None:
        """End the current snapshot window at ``now`` (on the sampler thread, or in
        ``Sampler.stop()`` once it has ended) and begin the next."""
        win = self.window
        assert win is not None
        keys = list(win.index)
        comm, nxt = self._read_comm(win.comm_from, win.t0)
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
            "hz": self._hz,
            "pid": os.getpid(),
            "seq": self._seq,
            "partial": partial,
        }
        self._seq += 1
        self.window = _Window(now, win.wall0 + (now - win.t0), nxt)
        with self._lock:
            self.snapshots.append(snap)
            while len(self.snapshots) > MAX_SNAPSHOTS:
                self.snapshots.popleft()
                self.dropped += 1

    def peek(
        self, window: float | None = None, since: int = -1, *, wall0: float, running: bool
    ) -> dict:
        """The rolling ``window`` (the last ``window`` seconds' stacks, None: not asked
        for) and the snapshots after ``since`` (those up to ``since`` are dropped: the
        notebook has them); ``wall0`` and ``running`` are the sampler's, told back.

        Example::

            w.peek(window=10, since=-1, wall0=wall0, running=True)["snapshots"]
        """
        with self._lock:
            while self.snapshots and self.snapshots[0]["seq"] <= since:
                self.snapshots.popleft()
            snaps = list(self.snapshots)
            slices = list(self._slices)
            current = self.slice.copy()  # atomic under the GIL: the thread goes on adding
            slice_t0 = self._slice_t0
        out: dict[str, Any] = {
            "snapshots": snaps,
            "dropped": self.dropped,
            "pid": os.getpid(),
            "wall0": wall0,
            "every": self.every,
            "running": running,
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
