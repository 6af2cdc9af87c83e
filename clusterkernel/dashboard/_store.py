"""The dashboard's model: every record every rank streamed, and the views' queries.

:class:`MetricsStore` is filled by the receiver thread and read by the drawing
thread (and by exports and tests), so every method takes its lock. It keeps the
full history (the plots thin what they draw, the record is never thinned) plus a
few running aggregates so that a redraw does not rescan the history:

- per rank and scalar name, growing numpy columns of steps and values;
- per rank and comm op, count / bytes / seconds / seconds waited.

Times inside records stay as each rank measured them (``perf_counter`` on that
rank, as in :mod:`clusterkernel.records`); ``wall_offset(rank)`` converts them to
wall-clock time for a timeline shared by all ranks.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

import numpy as np

from clusterkernel.records import COMM_FIELDS, comm_record, scalar_record, span_record

KINDS = ("comm", "scalar", "span")
MERGE_GAP = 0.001  # s: timeline intervals closer than this become one (drawing only)
MAX_SEGMENTS = 20_000  # per rank, for the timeline (the records themselves are all kept)
_OP, _NBYTES, _START, _DUR, _WAIT = (
    COMM_FIELDS.index(f) for f in ("op", "nbytes", "start", "duration", "wait")
)


class _Column:
    """A float64 array that grows by doubling, so appends are amortised O(1)."""

    __slots__ = ("_a", "n")

    def __init__(self) -> None:
        self._a = np.empty(64)
        self.n = 0

    def extend(self, values: list[float]) -> None:
        need = self.n + len(values)
        if need > len(self._a):
            grown = np.empty(max(need, 2 * len(self._a)))
            grown[: self.n] = self._a[: self.n]
            self._a = grown
        self._a[self.n : need] = values
        self.n = need

    def copy(self) -> np.ndarray:
        return self._a[: self.n].copy()


class _Rank:
    def __init__(self) -> None:
        self.records: dict[str, list] = {k: [] for k in KINDS}
        self.series: dict[str, tuple[_Column, _Column]] = {}
        self.comm_totals: dict[str, list[float]] = {}  # op -> [count, bytes, secs, wait]
        self.offset = 0.0  # wall - perf_counter on that rank
        self.seq = 0
        self.gaps = 0  # messages missing between sequence numbers
        self.lost = dict.fromkeys(KINDS, 0)
        self.proc: dict = {}
        self.last_seen = 0.0
        # timeline intervals in wall time, merged as they arrive, so a redraw only
        # walks the few hundred in its window: [kind, name, start, end]
        self.segments: deque[list] = deque(maxlen=MAX_SEGMENTS)
        self._open: dict[tuple[str, str], list] = {}

    def add_interval(self, kind: str, name: str, start: float, end: float) -> None:
        seg = self._open.get((kind, name))
        if seg is not None and seg[2] <= start <= seg[3] + MERGE_GAP:
            seg[3] = max(seg[3], end)
            return
        seg = [kind, name, start, end]
        self.segments.append(seg)
        self._open[(kind, name)] = seg


class MetricsStore:
    """Every record streamed from the ranks, with the queries the panels draw from.

    Example::

        store = MetricsStore()
        store.ingest(message)            # what the receiver does per message
        store.series("loss")             # {rank: (steps, values)}
        store.records("scalar")          # the records, as clusterkernel.records dicts
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ranks: dict[int, _Rank] = {}
        self.version = 0  # bumped on every ingest: the drawing thread redraws on change
        self.messages = 0

    # ------------------------------------------------------------------ input
    def ingest(self, msg: dict) -> None:
        """Add one stream message (see :mod:`clusterkernel._wire`)."""
        rank = msg["rank"]
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"bad rank {rank!r} in metric message")
        comm = msg.get("comm") or []
        scalars = msg.get("scalar") or []
        spans = msg.get("span") or []
        with self._lock:
            r = self._ranks.get(rank)
            if r is None:
                r = self._ranks[rank] = _Rank()
            seq = int(msg.get("seq", r.seq + 1))
            if seq > r.seq + 1:
                r.gaps += seq - r.seq - 1
            r.seq = max(r.seq, seq)
            r.offset = float(msg["wall"]) - float(msg["pc"])
            r.lost = {k: int(msg.get("lost", {}).get(k, 0)) for k in KINDS}
            r.proc = dict(msg.get("proc") or {})
            r.last_seen = time.time()
            r.records["comm"].extend(tuple(c) for c in comm)
            r.records["span"].extend(tuple(s) for s in spans)
            r.records["scalar"].extend((s[0], s[1], s[2]) for s in scalars)
            self._add_series(r, scalars)
            off = r.offset
            for c in comm:
                tot = r.comm_totals.setdefault(c[_OP], [0, 0, 0.0, 0.0])
                tot[0] += 1
                tot[1] += c[_NBYTES]
                tot[2] += c[_DUR]
                tot[3] += c[_WAIT]
                start = c[_START] + off
                end = start + c[_DUR]
                r.add_interval("comm", c[_OP], start, end)
                # blocked: the tail of the call spent waiting (all of it for sync calls)
                r.add_interval("blocked", "", end - min(c[_WAIT], c[_DUR]), end)
            for name, start, dur in spans:
                r.add_interval("span", name, start + off, start + off + dur)
            self.version += 1
            self.messages += 1
            self._lock.notify_all()

    @staticmethod
    def _add_series(r: _Rank, scalars: list) -> None:
        by_name: dict[str, tuple[list, list]] = {}
        for step, _t, values in scalars:
            for name, v in values.items():
                steps, vals = by_name.setdefault(name, ([], []))
                steps.append(step)
                vals.append(v)
        for name, (steps, vals) in by_name.items():
            cols = r.series.get(name)
            if cols is None:
                cols = r.series[name] = (_Column(), _Column())
            cols[0].extend(steps)
            cols[1].extend(vals)

    def wait_for(self, seqs: dict[int, int], timeout: float = 10.0) -> bool:
        """Wait until each ``rank`` has delivered message ``seq``; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                if all(r in self._ranks and self._ranks[r].seq >= s for r, s in seqs.items()):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)

    def clear(self) -> None:
        """Forget everything (a new run on the same dashboard)."""
        with self._lock:
            self._ranks.clear()
            self.version += 1

    # ------------------------------------------------------------------ queries
    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._ranks)

    def scalar_names(self) -> list[str]:
        with self._lock:
            return sorted({n for r in self._ranks.values() for n in r.series})

    def series(self, name: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{rank: (steps, values)}`` of one logged scalar, full history, copies."""
        with self._lock:
            return {
                rank: (cols[0].copy(), cols[1].copy())
                for rank, r in sorted(self._ranks.items())
                if (cols := r.series.get(name)) is not None
            }

    def last(self, name: str) -> dict[int, tuple[float, float]]:
        """``{rank: (step, value)}`` of the latest logged ``name`` on each rank."""
        with self._lock:
            out = {}
            for rank, r in sorted(self._ranks.items()):
                cols = r.series.get(name)
                if cols is not None and cols[0].n:
                    out[rank] = (cols[0]._a[cols[0].n - 1], cols[1]._a[cols[1].n - 1])
            return out

    def comm_table(self) -> list[dict]:
        """One row per rank and op: count, bytes, seconds in the call, seconds waited."""
        with self._lock:
            rows = []
            for rank, r in sorted(self._ranks.items()):
                for op, (count, nbytes, secs, wait) in sorted(r.comm_totals.items()):
                    rows.append(
                        {
                            "rank": rank,
                            "op": op,
                            "count": int(count),
                            "nbytes": int(nbytes),
                            "seconds": secs,
                            "wait_s": wait,
                        }
                    )
            return rows

    def timeline(self, window: float, now: float | None = None) -> list[tuple]:
        """Intervals that end within the last ``window`` seconds of wall time.

        Returns ``(rank, kind, name, start, end)`` with times in seconds relative
        to ``now`` (negative: in the past). ``kind`` is ``"comm"`` (a call, from
        issue to completion), ``"span"`` (a named ``metrics.span``) or
        ``"blocked"`` (the rank waited in a comm call). Intervals less than
        ``MERGE_GAP`` apart are merged: this is for drawing; :meth:`records` is exact.
        """
        now = time.time() if now is None else now
        since = now - window
        out = []
        with self._lock:
            for rank, r in sorted(self._ranks.items()):
                for i in range(len(r.segments) - 1, -1, -1):
                    kind, name, start, end = r.segments[i]
                    if end < since:
                        break  # newest last: everything before ended earlier
                    out.append((rank, kind, name, start - now, end - now))
        return out

    def status(self) -> dict[int, dict]:
        """Per rank: host, pid, cpu, rss_mib (from the rank), messages, records, age."""
        now = time.time()
        with self._lock:
            return {
                rank: {
                    **r.proc,
                    "seq": r.seq,
                    "gaps": r.gaps,
                    "lost": sum(r.lost.values()),
                    "records": {k: len(v) for k, v in r.records.items()},
                    "age_s": now - r.last_seen,
                }
                for rank, r in sorted(self._ranks.items())
            }

    def wall_offset(self, rank: int) -> float:
        with self._lock:
            return self._ranks[rank].offset

    def records(self, kind: str | None = None, ranks: Iterable[int] | None = None) -> list[dict]:
        """The stored records as :mod:`clusterkernel.records` dicts, by rank then time."""
        kinds = KINDS if kind is None else (kind,)
        if any(k not in KINDS for k in kinds):
            raise ValueError(f"unknown record kind {kind!r}; use one of {KINDS}")
        with self._lock:
            chosen = sorted(self._ranks) if ranks is None else list(ranks)
            raw = {r: {k: list(self._ranks[r].records[k]) for k in kinds} for r in chosen}
        out: list[dict] = []
        for rank, by_kind in raw.items():
            for k, items in by_kind.items():
                if k == "comm":
                    out.extend(comm_record(rank, t) for t in items)
                elif k == "scalar":
                    out.extend(scalar_record(rank, s, t, v) for s, t, v in items)
                else:
                    out.extend(span_record(rank, n, s, d) for n, s, d in items)
        return out
