"""The dashboard's model: every record every rank streamed, and the views' queries.

:class:`MetricsStore` is filled by the receiver thread and read by the drawing
thread (and by exports and tests), so every method takes its lock. It keeps the
full history (the plots thin what they draw, the record is never thinned) plus a
few running aggregates so that a redraw does not rescan the history:

- per rank and scalar name, growing numpy columns of steps and values;
- per rank and comm op, count / bytes / seconds / seconds waited.

Times inside records stay as each rank measured them (``perf_counter`` on that
rank, as in :mod:`clusterkernel.protocol.records`); ``wall_offset(rank)`` converts them to
wall-clock time for a timeline shared by all ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import numpy as np

from clusterkernel.protocol import _wire
from clusterkernel.protocol.records import KINDS, comm_record, scalar_record, span_record

MERGE_GAP = 0.001  # s: timeline intervals closer than this become one (drawing only)
# log() values that count samples since the previous such call: throughput from them
THROUGHPUT_COUNTS = ("samples", "batch_size")
MAX_SEGMENTS = 20_000  # per rank and interval kind/name kept for the timeline (records: all)


class _Column:
    """A float64 array that grows by doubling, so appends are amortised O(1)."""

    __slots__ = ("_a", "n")

    def __init__(self) -> None:
        self._a = np.empty(64)
        self.n = 0

    def extend(self, values) -> None:
        need = self.n + len(values)
        if need > len(self._a):
            grown = np.empty(max(need, 2 * len(self._a)))
            grown[: self.n] = self._a[: self.n]
            self._a = grown
        self._a[self.n : need] = values
        self.n = need

    def view(self) -> np.ndarray:
        return self._a[: self.n]

    def copy(self) -> np.ndarray:
        return self._a[: self.n].copy()

    def keep_last(self, k: int) -> None:
        if self.n > k:
            self._a[:k] = self._a[self.n - k : self.n]
            self.n = k


class _Segments:
    """One kind of interval on one rank (say, its all_reduce calls), merged and sorted.

    Kept as two growing columns so the timeline's query is a binary search and the
    panel gets arrays, not one Python object per interval.
    """

    __slots__ = ("start", "end")

    def __init__(self) -> None:
        self.start, self.end = _Column(), _Column()

    def add(self, s: np.ndarray, e: np.ndarray) -> None:
        n = self.start.n
        if n:  # the last interval may grow: merge it again with the new ones
            s = np.concatenate([self.start._a[n - 1 : n], s])
            e = np.concatenate([self.end._a[n - 1 : n], e])
            self.start.n = self.end.n = n - 1
        if len(s) > 1 and np.any(s[1:] < s[:-1]):  # async calls complete out of order
            order = np.argsort(s, kind="stable")
            s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1] + MERGE_GAP]))
        self.start.extend(s[first])
        self.end.extend(np.maximum.reduceat(e, first))
        if self.start.n > 2 * MAX_SEGMENTS:
            self.start.keep_last(MAX_SEGMENTS)
            self.end.keep_last(MAX_SEGMENTS)

    def since(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """The intervals that end at ``t`` or later."""
        i = int(np.searchsorted(self.end.view(), t, side="left"))
        return self.start.view()[i:], self.end.view()[i:]


def _numeric(column) -> np.ndarray | list:
    """An int64/float64 view of a wire array; a list column (a float step) stays a list."""
    return np.frombuffer(column, dtype=column.typecode) if hasattr(column, "typecode") else column


class _Rank:
    def __init__(self) -> None:
        # every record, as the column batches they arrived in (see clusterkernel.protocol._wire)
        self.chunks: dict[str, list[dict]] = {k: [] for k in KINDS}
        self.count = dict.fromkeys(KINDS, 0)
        self.series: dict[str, tuple[_Column, _Column]] = {}
        self.comm_totals: dict[str, list[float]] = {}  # op -> [count, bytes, secs, wait]
        self.comm_algs: dict[str, set[str]] = {}  # op -> algorithms it ran with ("auto"'s picks)
        self.offset = 0.0  # wall - perf_counter on that rank
        self.seq = 0
        self.gaps = 0  # messages missing between sequence numbers
        self.lost = dict.fromkeys(KINDS, 0)
        self.proc: dict = {}
        self.last_seen = 0.0
        # timeline intervals in wall time, merged as they arrive: (kind, name) -> _Segments
        self.segments: dict[tuple[str, str], _Segments] = {}
        self.counted_at = float("nan")  # time of the last log() with a samples count

    def derive_throughput(self, cols: dict, by_name: dict) -> None:
        """``samples_per_s`` from ``log(step=..., samples=n)`` (or ``batch_size=n``): the
        samples a call reports over the time since this rank's previous such call.
        A loop that logs ``samples_per_s`` itself keeps its own figures."""
        if "samples_per_s" in by_name:
            return
        times = np.asarray(_numeric(cols["time"]), dtype=float)
        if "values" in cols:
            name = next((n for n in THROUGHPUT_COUNTS if n in cols["values"]), None)
            if name is None:
                return
            steps, counts = by_name[name]
            steps, counts = np.asarray(steps, dtype=float), np.asarray(counts, dtype=float)
        else:  # mixed names: the records that carry a count
            found = ((i, next((v[n] for n in THROUGHPUT_COUNTS if n in v), None))
                     for i, v in enumerate(cols["dicts"]))  # fmt: skip
            picked = [(i, count) for i, count in found if count is not None]
            if not picked:
                return
            index = np.array([i for i, _ in picked])
            all_steps = np.asarray(list(_wire._seq(cols["step"])), dtype=float)
            steps, counts, times = all_steps[index], np.array([c for _, c in picked]), times[index]
        before = np.concatenate([[self.counted_at], times[:-1]])
        dt = times - before
        ok = np.isfinite(before) & (dt > 0)
        if ok.any():
            by_name["samples_per_s"] = (steps[ok], counts[ok] / dt[ok])
        self.counted_at = float(times[-1])

    def add_intervals(self, kind: str, name: str, start: np.ndarray, end: np.ndarray) -> None:
        if len(start):
            seg = self.segments.get((kind, name))
            if seg is None:
                seg = self.segments[(kind, name)] = _Segments()
            seg.add(start, end)


def _by_code(cat: _wire.Cat):
    """``(name, index)`` per distinct value of a string column (index: mask or ``:``)."""
    if len(cat.names) == 1:
        yield cat.names[0], slice(None)
        return
    codes = np.frombuffer(cat.codes, dtype=np.int64)
    for i, name in enumerate(cat.names):
        yield name, codes == i


def blocked_differs(rows: list[dict]) -> bool:
    """Whether any op spent less time blocked than in flight (async calls overlapped with
    work). A sync call blocks throughout, so for sync-only tables the column would repeat
    "total s" and is left out."""
    return any(r["wait_s"] < r["seconds"] * (1 - 1e-6) for r in rows)


class MetricsStore:
    """Every record streamed from the ranks, with the queries the panels draw from.

    Records are kept as the column batches they arrive in (numpy arrays, no Python
    object per record); :meth:`records` rebuilds the record dicts when asked.

    Example::

        store = MetricsStore()
        store.ingest(message)            # what the receiver does per message
        store.series("loss")             # {rank: (steps, values)}
        store.records("scalar")          # the records, as clusterkernel.protocol.records dicts
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ranks: dict[int, _Rank] = {}
        self.version = 0  # bumped on every ingest: the drawing thread redraws on change
        self.messages = 0

    # ------------------------------------------------------------------ input
    def ingest(self, msg: dict) -> None:
        """Add one stream message (see :mod:`clusterkernel.protocol._wire`; rows or columns)."""
        rank = msg["rank"]
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"bad rank {rank!r} in metric message")
        cols = {}
        for kind in KINDS:
            items = msg.get(kind) or {}
            if not isinstance(items, dict):
                items = _wire.to_columns(kind, items) if items else {}
            if items.get("n"):
                cols[kind] = items
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
            for kind, c in cols.items():
                r.chunks[kind].append(c)
                r.count[kind] += c["n"]
            if "scalar" in cols:
                self._add_series(r, cols["scalar"])
            if "comm" in cols:
                self._add_comm(r, cols["comm"])
            if "span" in cols:
                span = cols["span"]
                start = _numeric(span["start"]) + r.offset
                end = start + _numeric(span["duration"])
                for name, part in _by_code(span["name"]):
                    r.add_intervals("span", name, start[part], end[part])
            self.version += 1
            self.messages += 1
            self._lock.notify_all()

    @staticmethod
    def _add_series(r: _Rank, cols: dict) -> None:
        if "values" in cols:
            steps = np.asarray(_numeric(cols["step"]), dtype=float)
            by_name = {n: (steps, _numeric(v)) for n, v in cols["values"].items()}
        else:  # records of this batch logged different names: one by one
            by_name: dict[str, tuple[list, list]] = {}
            for step, values in zip(_wire._seq(cols["step"]), cols["dicts"]):
                for name, v in values.items():
                    steps, vals = by_name.setdefault(name, ([], []))
                    steps.append(step)
                    vals.append(v)
        r.derive_throughput(cols, by_name)
        for name, (steps, vals) in by_name.items():
            series = r.series.get(name)
            if series is None:
                series = r.series[name] = (_Column(), _Column())
            series[0].extend(steps)
            series[1].extend(vals)

    @staticmethod
    def _add_comm(r: _Rank, cols: dict) -> None:
        nbytes = np.asarray(_numeric(cols["nbytes"]))
        start = _numeric(cols["start"]) + r.offset
        dur = _numeric(cols["duration"])
        wait = _numeric(cols["wait"])
        end = start + dur
        algs = cols["alg"]
        alg_codes = np.frombuffer(algs.codes, dtype=np.int64) if len(algs.names) > 1 else None
        for op, part in _by_code(cols["op"]):
            used = r.comm_algs.setdefault(op, set())
            if alg_codes is None:
                used.add(algs.names[0])
            else:
                used.update(algs.names[i] for i in np.unique(alg_codes[part]))
            tot = r.comm_totals.setdefault(op, [0, 0, 0.0, 0.0])
            tot[0] += len(dur[part])
            tot[1] += int(nbytes[part].sum())
            tot[2] += float(dur[part].sum())
            tot[3] += float(wait[part].sum())
            r.add_intervals("comm", op, start[part], end[part])
        # blocked: the tail of the call spent waiting (all of it for sync calls)
        r.add_intervals("blocked", "", end - np.minimum(wait, dur), end)

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
                    out[rank] = (float(cols[0].view()[-1]), float(cols[1].view()[-1]))
            return out

    def comm_table(self) -> list[dict]:
        """One row per rank and op: count, bytes, seconds in the call, seconds waited,
        and the algorithms it ran with (what ``algorithm="auto"`` picked)."""
        with self._lock:
            rows = []
            for rank, r in sorted(self._ranks.items()):
                for op, (count, nbytes, secs, wait) in sorted(r.comm_totals.items()):
                    rows.append(
                        {
                            "rank": rank,
                            "op": op,
                            "algorithms": sorted(r.comm_algs.get(op, ())),
                            "count": int(count),
                            "nbytes": int(nbytes),
                            "seconds": secs,
                            "wait_s": wait,
                        }
                    )
            return rows

    def latest(self) -> float | None:
        """Wall time of the newest end of any comm call or span on any rank (None: none yet)."""
        with self._lock:
            ends = [
                seg.end.view()[-1]
                for r in self._ranks.values()
                for seg in r.segments.values()
                if seg.end.n
            ]
        return float(max(ends)) if ends else None

    def timeline_arrays(
        self, window: float, now: float | None = None
    ) -> dict[tuple[int, str, str], tuple[np.ndarray, np.ndarray]]:
        """:meth:`timeline` as ``{(rank, kind, name): (starts, ends)}`` arrays."""
        now = time.time() if now is None else now
        out = {}
        with self._lock:
            for rank, r in sorted(self._ranks.items()):
                for (kind, name), seg in r.segments.items():
                    start, end = seg.since(now - window)
                    if len(start):
                        out[(rank, kind, name)] = (start - now, end - now)
        return out

    def timeline(self, window: float, now: float | None = None) -> list[tuple]:
        """Intervals that end within the last ``window`` seconds of wall time.

        Returns ``(rank, kind, name, start, end)`` with times in seconds relative
        to ``now`` (negative: in the past). ``kind`` is ``"comm"`` (a call, from
        issue to completion), ``"span"`` (a named ``metrics.span``) or
        ``"blocked"`` (the rank waited in a comm call). Intervals less than
        ``MERGE_GAP`` apart are merged: this is for drawing; :meth:`records` is exact.
        """
        return [
            (rank, kind, name, s, e)
            for (rank, kind, name), (start, end) in self.timeline_arrays(window, now).items()
            for s, e in zip(start.tolist(), end.tolist())
        ]

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
                    "records": dict(r.count),
                    "age_s": now - r.last_seen,
                }
                for rank, r in sorted(self._ranks.items())
            }

    def wall_offset(self, rank: int) -> float:
        with self._lock:
            return self._ranks[rank].offset

    def records(self, kind: str | None = None, ranks: Iterable[int] | None = None) -> list[dict]:
        """The stored records as :mod:`clusterkernel.protocol.records` dicts, by rank then time."""
        kinds = KINDS if kind is None else (kind,)
        if any(k not in KINDS for k in kinds):
            raise ValueError(f"unknown record kind {kind!r}; use one of {KINDS}")
        with self._lock:
            chosen = sorted(self._ranks) if ranks is None else list(ranks)
            raw = {r: {k: list(self._ranks[r].chunks[k]) for k in kinds} for r in chosen}
        out: list[dict] = []
        for rank, by_kind in raw.items():
            for k, chunks in by_kind.items():
                for c in chunks:
                    rows = _wire.to_rows(k, c)
                    if k == "comm":
                        out.extend(comm_record(rank, t) for t in rows)
                    elif k == "scalar":
                        out.extend(scalar_record(rank, s, t, v) for s, t, v in rows)
                    else:
                        out.extend(span_record(rank, n, s, d) for n, s, d in rows)
        return out
