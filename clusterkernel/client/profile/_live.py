"""A running profile, watched: the rolling window and the periodic snapshots (client side).

While a profile runs on a cluster (``%%mpi --profile``, ``%mpi profile start``), a
:class:`LiveProfile` stands for it in the notebook. A thread of its own (niced, as the
dashboard's are: it shares the cores with the ranks) pulls from every rank, on the
control channel that ipykernel answers while the cell keeps the rank's main thread
busy (``protocol._names.PROFILE_PEEK``):

- the **snapshots** the ranks cut themselves every ``every`` seconds, each pull taking
  what came since the last (the rank then drops what the notebook has), every
  ``every`` seconds;
- the **rolling window** (the last :data:`WINDOW` seconds of each rank's stacks), only
  while a dashboard's profile panel asks for it (:meth:`LiveProfile.want`), every
  :data:`PANEL_PERIOD` seconds.

Nothing is pulled when neither is wanted: a plain ``%%mpi --profile`` without a
dashboard costs the ranks no more than before. A snapshot pulled is kept here, so a
rank that dies or restarts later keeps what it sampled up to its last snapshot (the
profile at stop says so, see :func:`lost_reasons`).

Example::

    cluster.profile("start", every=60)        # %mpi profile start --every 60s
    cluster.run(train_for_hours)
    snaps = snapshots(cluster)                # [Snapshot, ...], one per minute so far
    snaps[120].difference()[0]                # what the straggler did more in minute 120
    snaps[120].save("minute120.speedscope.json")
"""

from __future__ import annotations

import datetime
import html
import re
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from clusterkernel.client.errors import format_ranks
from clusterkernel.client.profile._model import Profile
from clusterkernel.protocol._names import PROFILE_PEEK

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

WINDOW = 10.0
"""Seconds of the rolling window the dashboard's panel shows."""
PANEL_PERIOD = 2.0
"""Seconds between pulls of the rolling window while a panel wants it."""
PANEL_HOLD = 6.0
"""A panel's ask (:meth:`LiveProfile.want`) holds this long: a dashboard closed stops the pulls."""
KEEP = 1000
"""Snapshot windows kept in the notebook (the oldest go first): 16 h at ``every=60``."""
KEEP_TIMELINES = 10
"""The newest windows keep their timelines; older ones only their totals (their
speedscope export is then by weight, their Chrome trace has no Python boxes). A
minute's timeline at 100 Hz is up to 6,000 runs per thread and rank (~1 MB): the
totals of 1,000 windows take less than ten timelines do."""
PULL_TIMEOUT = 3.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*$")


def parse_every(value: Any) -> float:
    """Seconds from ``60``, ``"60"``, ``"60s"``, ``"5m"``, ``"1.5h"``, ``"500ms"``;
    a ValueError saying what to write otherwise (at least 0.1 s).

    Example::

        parse_every("5m")    # 300.0
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        secs = float(value)
    else:
        m = _DURATION.match(str(value))
        if m is None:
            raise ValueError(
                f"--every takes a duration such as 60s, 5m or 1h (a number alone is "
                f"seconds), not {value!r}: e.g. --every 60s for a snapshot a minute"
            )
        secs = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not secs >= 0.1 or secs != secs or secs == float("inf"):
        raise ValueError(f"--every is at least 0.1 s (e.g. 60s, 5m, 1h), not {value!r}")
    return secs


class Snapshot(Profile):
    """Every rank's profile over one window of a long profile (``every``): a
    :class:`Profile` (tables, difference, ``save``) with its window's place in time.

    ``index``: the window's number from 0; ``start``/``end``: wall times
    (``time.time()``) of its first and last rank; ``partial``: the last window, cut
    short by the stop.

    Example::

        s = snapshots(cluster)[-1]
        s.start, s.end, s.slowest
        s.save("last-minute.json")     # Chrome/Perfetto trace of that window
    """

    def __init__(self, index: int, ranks: dict[int, dict], missing: list[int] | None = None):
        super().__init__(ranks, missing)
        self.index = index
        walls = [d.get("wall0", 0.0) for d in self.ranks.values()]
        self.start = min(walls, default=0.0)
        self.end = max(
            (d.get("wall0", 0.0) + d.get("seconds", 0.0) for d in self.ranks.values()),
            default=0.0,
        )
        self.partial = any(d.get("partial") for d in self.ranks.values())

    def __repr__(self) -> str:
        return (
            f"<Snapshot {self.index} {_clock(self.start)}-{_clock(self.end)} "
            f"ranks={format_ranks(list(self.ranks))} slowest={self.slowest}>"
        )


class Snapshots(list):
    """The snapshots of a profile, oldest first, shown as one line per window: when,
    the slowest rank, its busy seconds, and the line it spent the most time on.

    Example::

        print(snapshots(cluster))    # a slowdown at hour two stands out in the busy column
    """

    def _rows(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for s in self:
            slow = s.slowest
            top = s.top(slow, n=1) if slow is not None else []
            rows.append(
                (
                    str(s.index),
                    f"{_clock(s.start)}-{_clock(s.end)}" + (" (partial)" if s.partial else ""),
                    "" if slow is None else str(slow),
                    "" if slow is None else f"{s.busy(slow):.2f}",
                    f"{top[0].where} {top[0].function}" if top else "",
                )
            )
        return rows

    _HEAD = ("window", "from-to", "slowest rank", "busy s", "its top line")

    def __str__(self) -> str:
        if not self:
            return "No snapshots (profile with every=..., e.g. %mpi profile start --every 60s)."
        from clusterkernel.client.profile._model import _text_table

        return _text_table(self._HEAD, self._rows())

    def _repr_html_(self) -> str:
        from clusterkernel.client.profile._model import _html_table

        if not self:
            return f"<i>{html.escape(str(self))}</i>"
        return _html_table(self._HEAD, self._rows())


def _clock(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall).strftime("%H:%M:%S") if wall else "?"


class LiveProfile:
    """The notebook's side of one running profile: pulls, keeps and hands out its
    snapshots and rolling window. Made by ``CellProfile``; :meth:`close` at its end.

    Example::

        live = current(cluster)
        live.want()                    # a panel asks for the rolling window
        live.window                    # {rank: {"stacks": [...], "seconds": 10.0, ...}}
    """

    def __init__(
        self, cluster: Cluster, ranks: list[int], every: float | None, keep: int = KEEP
    ) -> None:
        self.cluster = cluster
        self.ranks = list(ranks)
        self.every = every
        self.keep = keep
        self._started: Any = None  # the start's AsyncResult: each rank's pid
        self.window: dict[int, dict] = {}  # rank -> its last rolling window
        self.window_version = 0  # grows with each pull that brought a window
        self.running = True
        self.errors: dict[int, str] = {}  # rank -> why its last pull failed
        self.dropped: dict[int, int] = {}  # rank -> snapshots it dropped unread
        self._windows: dict[int, dict[int, dict]] = {}  # seq -> rank -> snapshot data
        self._since: dict[int, int] = {}  # rank -> last seq taken
        self._wanted_until = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- thread
    @property
    def pids(self) -> dict[int, int]:
        """``{rank: pid}`` of the processes whose samplers started ({} until they have)."""
        ar = self._started
        try:
            if ar is not None and ar.ready() and ar.successful():
                return {r: pid for r, pid in zip(self.ranks, ar.get()) if isinstance(pid, int)}
        except Exception:  # a rank lost with its engine
            pass
        return {}

    def begin(self, started: Any) -> None:
        """Start pulling; ``started``: the samplers' start (an AsyncResult of their pids)."""
        self._started = started
        if self.every is None:
            return  # a panel that asks starts the thread (want())
        self._start_thread()

    @property
    def wanted(self) -> bool:
        """Whether a panel asked for the rolling window lately."""
        return time.monotonic() < self._wanted_until

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None or not self.running:
                return
            self._thread = threading.Thread(target=self._loop, name="clusterkernel-profile-pull")
            self._thread.daemon = True
            self._thread.start()

    def want(self) -> None:
        """Pull the rolling window for the next :data:`PANEL_HOLD` seconds (a panel on show)."""
        self._wanted_until = time.monotonic() + PANEL_HOLD
        self._start_thread()

    def _loop(self) -> None:
        from clusterkernel.client.dashboard._receiver import lower_thread_priority

        lower_thread_priority()
        next_snap = time.monotonic() + (self.every or 0.0)
        next_window = 0.0
        while not self._stop.wait(0.25):
            if not self.cluster.running:
                return  # stopped with the profile still on: nothing left to pull
            now = time.monotonic()
            panel = now < self._wanted_until and now >= next_window
            snaps = self.every is not None and now >= next_snap
            if not (panel or snaps):
                continue
            try:
                self.pull(window=WINDOW if panel else None)
            except Exception as e:  # a cluster stopping under us: keep what we have
                self.errors[-1] = f"{type(e).__name__}: {e}"
            if panel:
                next_window = time.monotonic() + PANEL_PERIOD
            if snaps and self.every is not None:
                next_snap = time.monotonic() + self.every

    def close(self) -> None:
        """Stop pulling (the profile ended)."""
        self.running = False
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(PULL_TIMEOUT + 2)

    # ---------------------------------------------------------------- pulling
    def pull(self, window: float | None = None, timeout: float = PULL_TIMEOUT) -> None:
        """Ask every rank for its new snapshots (and the rolling ``window``) now."""
        from clusterkernel.client.cluster import _ipp

        engines = {}
        for r in self.ranks:
            try:
                engines[r] = self.cluster.engine_id(r)
            except Exception as e:  # dead or gone: said at stop
                self.errors[r] = str(e)
        replies: dict[int, dict] = {}
        # one request per rank: each says which snapshots it has already
        futures = {
            r: _ipp.control_send(
                self.cluster.client,
                eid,
                PROFILE_PEEK,
                {"window": window, "since": self._since.get(r, -1)},
            )
            for r, eid in engines.items()
        }
        deadline = time.monotonic() + timeout
        for r, fut in futures.items():
            try:
                msg = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                self.errors[r] = f"no answer within {timeout:g} s"
                continue
            replies[r] = msg.get("content", {})
        got_window = False
        for r, reply in replies.items():
            if reply.get("status") != "ok":
                self.errors[r] = reply.get("error", "its sampler could not be read")
                continue
            if not reply.get("running", True) and not reply.get("snapshots"):
                continue  # not started yet, or stopped: nothing to take
            self.errors.pop(r, None)
            self.absorb(r, reply.get("snapshots") or [], reply.get("dropped", 0))
            if reply.get("window") is not None:
                self.window[r] = reply["window"]
                got_window = True
        if got_window:
            self.window_version += 1

    def absorb(self, rank: int, snaps: list[dict], dropped: int = 0) -> None:
        """Keep ``rank``'s snapshots (those seen already are skipped)."""
        with self._lock:
            if dropped:
                self.dropped[rank] = dropped
            for snap in snaps:
                seq = snap.get("seq", 0)
                if seq <= self._since.get(rank, -1):
                    continue
                self._since[rank] = seq
                self._windows.setdefault(seq, {})[rank] = snap
            seqs = sorted(self._windows)
            for seq in seqs[: max(0, len(seqs) - self.keep)]:
                del self._windows[seq]
            for seq in seqs[-self.keep : -KEEP_TIMELINES] if len(seqs) > KEEP_TIMELINES else []:
                for data in self._windows.get(seq, {}).values():
                    if data.get("timeline"):
                        # totals only from here: exports fall back to them
                        data["timeline"], data["truncated"] = {}, True

    # ---------------------------------------------------------------- reading
    def snapshots(self) -> Snapshots:
        """Every window kept so far, oldest first (a rank missing from one: not pulled
        yet, or gone)."""
        with self._lock:
            items = sorted((seq, dict(ranks)) for seq, ranks in self._windows.items())
        return Snapshots(
            Snapshot(seq, ranks, [r for r in self.ranks if r not in ranks]) for seq, ranks in items
        )

    def merged(self, rank: int) -> dict | None:
        """``rank``'s samples over every snapshot kept, as one profile's data (totals
        only): what is left of a rank whose own stop could not answer."""
        with self._lock:
            parts = [w[rank] for _s, w in sorted(self._windows.items()) if rank in w]
        if not parts:
            return None
        total: dict[tuple, float] = {}
        for data in parts:
            for thread, stack, secs in data.get("stacks", []):
                key = (thread, tuple(tuple(f) for f in stack))
                total[key] = total.get(key, 0.0) + secs
        return {
            "stacks": [[t, [list(f) for f in st], v] for (t, st), v in total.items()],
            "timeline": {},
            "truncated": True,
            "wall0": parts[0].get("wall0", 0.0),
            "t0": parts[0].get("t0", 0.0),
            "seconds": sum(d.get("seconds", 0.0) for d in parts),
            "samples": sum(d.get("samples", 0) for d in parts),
            "hz": parts[0].get("hz"),
            "pid": parts[0].get("pid"),
            "until": parts[-1].get("wall0", 0.0) + parts[-1].get("seconds", 0.0),
        }

    def window_profile(self) -> Profile | None:
        """The rolling window of every rank that sent one, as a :class:`Profile`."""
        if not self.window:
            return None
        return Profile(dict(self.window))


# cluster -> the profile running on it; cluster -> the last one that ended (weak keys)
_running: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ended: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def current(cluster: object) -> LiveProfile | None:
    """The profile running on ``cluster`` now, or the last one that ended (None: never).

    Example::

        live = current(cluster); live.running
    """
    return _running.get(cluster) or _ended.get(cluster)


def snapshots(cluster: Cluster, pull: bool = True) -> Snapshots:
    """The snapshots of the profile running on ``cluster`` (pulled now, ``pull``), or
    of the last one that ran; empty when none was started with ``every``.

    Example::

        cluster.profile("start", every="1m")
        ...
        snapshots(cluster)[-1].top(0)
    """
    live = current(cluster)
    if live is None:
        return Snapshots()
    if pull and live.running and live.every is not None:
        live.pull()
    return live.snapshots()


def lost_reasons(cluster: Cluster, live: LiveProfile, ranks: list[int]) -> dict[int, str]:
    """Why each of ``ranks`` gave no profile at stop: died, restarted or respawned since
    the start (a new process: the samples were in the old one), or did not answer."""
    info = cluster.rank_info if cluster.running else {}
    out = {}
    for r in ranks:
        try:
            cluster.engine_id(r)
        except Exception as e:
            out[r] = f"gone: {str(e).splitlines()[0]}"
            continue
        old, new = live.pids.get(r), (info.get(r) or {}).get("pid")
        if old is not None and new is not None and old != new:
            out[r] = (
                f"restarted or respawned since the profile started (pid {old}, now {new}): "
                "its samples were in the old process"
            )
        elif r in live.errors:
            out[r] = live.errors[r]
        else:
            out[r] = "its sampler was not running at stop"
    return out
