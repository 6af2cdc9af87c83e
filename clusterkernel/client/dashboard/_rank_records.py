"""One rank's records in the dashboard's store: column batches, series, timeline segments.

:class:`~clusterkernel.client.dashboard._store.MetricsStore` keeps one :class:`_Rank`
per rank, under its lock: the record batches as they arrived (see
:mod:`clusterkernel.protocol._wire`), the growing columns of each scalar series
(:class:`_Column`), the running comm totals, the cell marks that split records into
runs, and the timeline's intervals merged as they arrive (:class:`_Segments`).

Example::

    r = _Rank()
    r.add_intervals("comm", "all_reduce", np.array([0.0]), np.array([0.5]))
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

from clusterkernel.protocol import _wire
from clusterkernel.protocol.records import KINDS

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
        self.series: dict[tuple[int, str], tuple[_Column, _Column]] = {}  # (run, name)
        # (run, op) -> [count, bytes, secs, wait, calls whose wait was measured]
        self.comm_totals: dict[tuple[int, str], list[float]] = {}
        self.comm_algs: dict[tuple[int, str], set[str]] = {}  # algorithms ("auto"'s picks)
        self.offset = 0.0  # wall - perf_counter on that rank
        self.seq = 0
        self.gaps = 0  # messages missing between sequence numbers
        self.lost = dict.fromkeys(KINDS, 0)
        self.proc: dict = {}
        self.last_seen = 0.0
        # timeline intervals in wall time, merged as they arrive: (kind, name) -> _Segments
        self.segments: dict[tuple[str, str], _Segments] = {}
        self.counted_at = float("nan")  # time of the last log() with a samples count
        self.counted_run = -1  # the run counted_at belongs to
        # the rank's cell marks: names and, per kind, the absolute index each begins at
        self.mark_names: list[str] = []
        self.mark_at: dict[str, list[int]] = {k: [] for k in KINDS}
        self.next_at = dict.fromkeys(KINDS, 0)  # absolute index after the last record

    def forget(self) -> None:
        """Drop the records and what was derived from them; keep the stream's state
        (sequence numbers, clock offset, cell marks), which later messages rely on."""
        self.chunks = {k: [] for k in KINDS}
        self.count = dict.fromkeys(KINDS, 0)
        self.series.clear()
        self.comm_totals.clear()
        self.comm_algs.clear()
        self.segments.clear()
        self.counted_at, self.counted_run = float("nan"), -1

    def add_marks(self, cells: Iterable) -> None:
        for name, *at in cells:
            for kind, i in zip(KINDS, at):
                self.mark_at[kind].append(int(i))
            self.mark_names.append(str(name))

    def cells_of(self, kind: str, start: int, n: int) -> list[tuple[str | None, int, int]]:
        """``[(cell, lo, hi), ...]``: which cell's mark governs records ``lo:hi`` of a
        batch of ``n`` records of ``kind`` whose first has absolute index ``start``."""
        at, out, lo = self.mark_at[kind], [], 0
        while lo < n:
            k = bisect.bisect_right(at, start + lo)  # marks at or before record lo
            hi = n if k >= len(at) else min(n, at[k] - start)
            out.append((self.mark_names[k - 1] if k > 0 else None, lo, hi))
            lo = hi
        return out

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
    """``(name, index)`` per distinct value of a string column (index: mask or ``:``);
    names no record carries are left out."""
    if len(cat.names) == 1:
        if len(cat.codes):
            yield cat.names[0], slice(None)
        return
    codes = np.asarray(_numeric(cat.codes), dtype=np.int64)
    for i, name in enumerate(cat.names):
        part = codes == i
        if part.any():
            yield name, part


def _slice(cols: dict, lo: int, hi: int) -> dict:
    """Records ``lo:hi`` of a batch in column form."""
    if lo == 0 and hi == cols["n"]:
        return cols
    out: dict = {"n": hi - lo}
    for k, v in cols.items():
        if k == "n":
            continue
        if isinstance(v, _wire.Cat):
            out[k] = _wire.Cat(v.names, v.codes[lo:hi])
        elif isinstance(v, dict):
            out[k] = {name: c[lo:hi] for name, c in v.items()}
        else:
            out[k] = v[lo:hi]
    return out
