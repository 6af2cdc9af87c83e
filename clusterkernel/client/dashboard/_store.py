"""The dashboard's model: every record every rank streamed, and the views' queries.

:class:`MetricsStore` is filled by the receiver thread and read by the drawing
thread (and by exports and tests), so every method takes its lock. It keeps the
full history (the plots thin what they draw, the record is never thinned) plus a
few running aggregates so that a redraw does not rescan the history:

- per run, rank and scalar name, growing numpy columns of steps and values;
- per run, rank and comm op, count / bytes / seconds / seconds waited.

A **run** is one execution of a cell that recorded something: the ranks mark each
cell they run (``Recorder.mark_cell``), the stream sends the marks with the
records, and records of the same cell on every rank form one run. Re-running a
training cell therefore starts a new run (new lines, never joined to the old
ones); the panels show the newest run and earlier ones faint. Runs that logged a
scalar (``log(...)``: what the loss and throughput panels draw) are numbered from 1 in
the order they ran, "run 1", "run 2"; a cell that only communicated (a set-up
``all_reduce`` before the training cell) is a run of the comm table but takes no
number, so the first training cell is "run 1" whatever ran before it.

Times inside records stay as each rank measured them (``perf_counter`` on that
rank, as in :mod:`clusterkernel.protocol.records`); ``wall_offset(rank)`` converts them to
wall-clock time for a timeline shared by all ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

# one rank's columns and segments: a named part of the store
from clusterkernel.client.dashboard._rank_records import (
    _by_code,
    _Column,
    _numeric,
    _Rank,
    _slice,
)
from clusterkernel.protocol import _wire
from clusterkernel.protocol.records import KINDS, comm_record, scalar_record, span_record


def blocked_differs(rows: list[dict]) -> bool:
    """Whether any op spent less time blocked than in flight (async calls overlapped with
    work). A sync call blocks throughout, so for sync-only tables the column would repeat
    "total s" and is left out. Rows whose blocked time was not measured (``wait_s``
    None: torch's DDP buckets) do not count."""
    return any(r["wait_s"] is not None and r["wait_s"] < r["seconds"] * (1 - 1e-6) for r in rows)


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
        # runs, oldest first: {"run", "cell", "ranks", "start", "end", "scalars", "comm"}
        self._runs: list[dict] = []
        self._next_run = 0
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
        at = msg.get("at") or {}
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
            r.add_marks(msg.get("cells") or ())
            for kind, c in cols.items():
                r.chunks[kind].append(c)
                r.count[kind] += c["n"]
                start = int(at.get(kind, r.next_at[kind]))
                r.next_at[kind] = start + c["n"]
                for cell, lo, hi in r.cells_of(kind, start, c["n"]):
                    run = self._run_for(cell, rank)
                    times = self._add(r, kind, _slice(c, lo, hi), run)
                    if len(times):
                        run["start"] = min(run["start"], float(np.min(times)))
                        run["end"] = max(run["end"], float(np.max(times)))
            # ranks' streams interleave: a later cell's records can come before a
            # lagging rank's of an earlier cell, so runs are kept in the order they ran
            self._runs.sort(key=lambda run: run["start"])
            self.version += 1
            self.messages += 1
            self._lock.notify_all()

    def _run_for(self, cell: str | None, rank: int) -> dict:
        """The run of ``cell``'s records (a new one for a cell not seen lately).

        Records made outside any cell (no mark yet) join the newest run."""
        for run in reversed(self._runs[-16:]):
            if run["cell"] == cell or (cell is None and run is self._runs[-1]):
                run["ranks"].add(rank)
                return run
        run = {
            "run": self._next_run, "cell": cell, "ranks": {rank}, "start": np.inf,
            "end": -np.inf, "scalars": set(), "comm": 0,
        }  # fmt: skip
        self._next_run += 1
        self._runs.append(run)
        return run

    def _add(self, r: _Rank, kind: str, cols: dict, run: dict) -> np.ndarray:
        """File one cell's records of one kind; return their (wall) times."""
        if kind == "scalar":
            self._add_series(r, cols, run)
            return np.asarray(_numeric(cols["time"]), dtype=float) + r.offset
        if kind == "comm":
            run["comm"] += cols["n"]
            return self._add_comm(r, cols, run["run"])
        start = np.asarray(_numeric(cols["start"]), dtype=float) + r.offset
        end = start + _numeric(cols["duration"])
        for name, part in _by_code(cols["name"]):
            r.add_intervals("span", name, start[part], end[part])
        return start

    @staticmethod
    def _add_series(r: _Rank, cols: dict, run: dict) -> None:
        by_name: dict[str, tuple[Any, Any]]  # name -> (steps, values): arrays or lists
        if "values" in cols:
            steps = np.asarray(_numeric(cols["step"]), dtype=float)
            by_name = {n: (steps, _numeric(v)) for n, v in cols["values"].items()}
        else:  # records of this batch logged different names: one by one
            by_name = {}
            for step, values in zip(_wire._seq(cols["step"]), cols["dicts"]):
                for name, v in values.items():
                    steps, vals = by_name.setdefault(name, ([], []))
                    steps.append(step)
                    vals.append(v)
        if r.counted_run != run["run"]:  # throughput: a new run counts from its own start
            r.counted_at, r.counted_run = float("nan"), run["run"]
        r.derive_throughput(cols, by_name)
        for name, (steps, vals) in by_name.items():
            series = r.series.get((run["run"], name))
            if series is None:
                series = r.series[(run["run"], name)] = (_Column(), _Column())
            series[0].extend(steps)
            series[1].extend(vals)
            run["scalars"].add(name)

    @staticmethod
    def _add_comm(r: _Rank, cols: dict, run: int) -> np.ndarray:
        nbytes = np.asarray(_numeric(cols["nbytes"]))
        start = np.asarray(_numeric(cols["start"]), dtype=float) + r.offset
        dur = np.asarray(_numeric(cols["duration"]), dtype=float)
        wait = np.asarray(_numeric(cols["wait"]), dtype=float)
        end = start + dur
        algs = cols["algorithm"]
        alg_codes = (
            np.asarray(_numeric(algs.codes), dtype=np.int64) if len(algs.names) > 1 else None
        )
        for op, part in _by_code(cols["op"]):
            used = r.comm_algs.setdefault((run, op), set())
            if alg_codes is None:
                used.add(algs.names[0])
            else:
                used.update(algs.names[i] for i in np.unique(alg_codes[part]))
            tot = r.comm_totals.setdefault((run, op), [0, 0, 0.0, 0.0, 0])
            known = np.isfinite(wait[part])  # NaN: the blocked time was not measured
            tot[0] += len(dur[part])
            tot[1] += int(nbytes[part].sum())
            tot[2] += float(dur[part].sum())
            tot[3] += float(wait[part][known].sum())
            tot[4] += int(known.sum())
            r.add_intervals("comm", op, start[part], end[part])
        # blocked: the tail of the call spent waiting (all of it for sync calls)
        known = np.isfinite(wait)
        r.add_intervals("blocked", "", (end - np.minimum(wait, dur))[known], end[known])
        return start

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
        """Forget every record and run (the panels start empty; the ranks keep theirs).

        Example::

            store.clear()
            store.runs()   # []
        """
        with self._lock:
            for r in self._ranks.values():
                r.forget()
            self._runs.clear()
            self.version += 1

    # ------------------------------------------------------------------ runs
    def runs(self) -> list[dict]:
        """The runs in the order they ran (their first record's wall time): ``run`` (its
        id, in order of arrival, what the queries take), ``number`` (from 1 among the
        runs that logged a scalar, in the order they ran; None for a run without one),
        ``label`` ("run 1", ...; "" without a number), ``cell`` (the cell's mark),
        ``ranks``, wall-time ``start`` and ``end``, ``scalars`` (names logged) and
        ``comm`` (calls recorded).

        Example::

            [r["label"] for r in store.runs()]   # ['run 1', 'run 2']: a cell run twice
        """
        with self._lock:
            out, number = [], 0
            for run in self._runs:
                number += bool(run["scalars"])
                mine = number if run["scalars"] else None
                out.append(
                    {**run, "number": mine, "label": f"run {mine}" if mine else "",
                     "ranks": sorted(run["ranks"]), "scalars": sorted(run["scalars"])}
                )  # fmt: skip
            return out

    def run_label(self, run: int | None) -> str:
        """The label of run id ``run`` ("run 2"; "" for a run that logged no scalar).

        Example::

            store.run_label(store.current_run("loss"))   # 'run 1'
        """
        return next((r["label"] for r in self.runs() if r["run"] == run), "")

    def heading(self) -> str:
        """Which training run is newest, of how many: ``"run 2 of 2"`` ("" before any
        run logged a scalar). The dashboard's header starts with it."""
        numbered = [r for r in self.runs() if r["number"]]
        return f"run {numbered[-1]['number']} of {len(numbered)}" if numbered else ""

    def current_run(self, name: str | None = None, comm: bool = False) -> int | None:
        """The newest run that logged scalar ``name`` (any record: ``name`` None; a
        comm call: ``comm=True``); None before there is one."""
        with self._lock:
            for run in reversed(self._runs):
                if comm and not run["comm"]:
                    continue
                if name is not None and name not in run["scalars"]:
                    continue
                return run["run"]
            return None

    def run_span(self, run: int) -> tuple[float, float]:
        """Wall times of ``run``'s first and last record."""
        with self._lock:
            for r in self._runs:
                if r["run"] == run:
                    return r["start"], r["end"]
        raise KeyError(f"no run {run}")

    # ------------------------------------------------------------------ queries
    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._ranks)

    def scalar_names(self) -> list[str]:
        """Every scalar name logged in any run."""
        with self._lock:
            return sorted({n for r in self._ranks.values() for _, n in r.series})

    def series(self, name: str, run: int | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{rank: (steps, values)}`` of one logged scalar in one run (default: the newest
        run that logged it), every point, copies."""
        run = self.current_run(name) if run is None else run
        if run is None:
            return {}  # nothing logged it yet
        with self._lock:
            return {
                rank: (cols[0].copy(), cols[1].copy())
                for rank, r in sorted(self._ranks.items())
                if (cols := r.series.get((run, name))) is not None
            }

    def last(self, name: str, run: int | None = None) -> dict[int, tuple[float, float]]:
        """``{rank: (step, value)}`` of the latest logged ``name`` on each rank (in ``run``,
        default: the newest run that logged it)."""
        run = self.current_run(name) if run is None else run
        if run is None:
            return {}  # nothing logged it yet
        with self._lock:
            out = {}
            for rank, r in sorted(self._ranks.items()):
                cols = r.series.get((run, name))
                if cols is not None and cols[0].n:
                    out[rank] = (float(cols[0].view()[-1]), float(cols[1].view()[-1]))
            return out

    def comm_table(self, run: int | None = None) -> list[dict]:
        """One row per rank and op of one run (default: the newest run with comm calls):
        count, bytes, seconds in the call, seconds blocked (``wait_s``: None where not
        measured, as for torch's DDP buckets), and the algorithms it ran with (what
        ``algorithm="auto"`` picked)."""
        run = self.current_run(comm=True) if run is None else run
        with self._lock:
            rows = []
            for rank, r in sorted(self._ranks.items()):
                for (at, op), tot in sorted(r.comm_totals.items()):
                    if at != run:
                        continue
                    count, nbytes, secs, wait, known = tot
                    rows.append(
                        {
                            "rank": rank,
                            "op": op,
                            "algorithms": sorted(r.comm_algs.get((at, op), ())),
                            "count": int(count),
                            "nbytes": int(nbytes),
                            "seconds": secs,
                            "wait_s": wait if known else None,
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
        self, window: float, now: float | None = None, since: float | None = None
    ) -> dict[tuple[int, str, str], tuple[np.ndarray, np.ndarray]]:
        """:meth:`timeline` as ``{(rank, kind, name): (starts, ends)}`` arrays; ``since``
        (wall time, say a run's start) leaves out the intervals that ended before it."""
        now = time.time() if now is None else now
        t0 = now - window if since is None else max(now - window, since)
        out = {}
        with self._lock:
            for rank, r in sorted(self._ranks.items()):
                for (kind, name), seg in r.segments.items():
                    start, end = seg.since(t0)
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
