"""Engine-side metric recorder: communication events, logged scalars, compute spans.

Each MPI rank has one :class:`Recorder` (``metrics.recorder()``). The comm layer
writes one row per call into a preallocated ring (:mod:`._ring`, fields in
:data:`clusterkernel.protocol.records.COMM_LAYOUT` order; the C fast path writes the
same rows), training code logs scalars with :func:`log`, and :meth:`Recorder.span`
times a block of compute. Readers get plain ``dict`` records (the shapes in
:mod:`clusterkernel.protocol.records`) from :meth:`Recorder.records` (everything kept) or
:meth:`Recorder.drain` (only what is new since the last drain).

Storage is the comm ring and one append-only list per other kind, plus a read cursor
per kind, so recording a comm call allocates nothing and a scalar costs a tuple and a
list append. :meth:`Recorder.read` reads by absolute index
(records ever appended), so the live stream to the notebook
(:func:`clusterkernel.metrics.stream`, running in its own thread) never moves the
``drain`` cursor and never makes the recording call wait.

Example::

    from clusterkernel import metrics
    with metrics.recorder().span("forward"):
        loss = loss_fn(model(x), y)
    metrics.log(step=3, loss=loss.item(), samples=64)   # samples: for throughput
    new = metrics.recorder().drain()   # [{"kind": "comm", ...}, {"kind": "scalar", ...}, ...]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from clusterkernel.metrics import _attached, _cells
from clusterkernel.metrics._ring import CommRing
from clusterkernel.protocol.records import (
    KINDS,
    comm_record,
    scalar_record,
    span_record,
)

_now = time.perf_counter
DEFAULT_CAPACITY = 1_000_000


def _detect_rank() -> int:
    # Environment first: importing mpi4py here would initialise MPI as a side effect.
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return 0


class _Span:
    __slots__ = ("_rec", "_name", "_start")

    def __init__(self, rec: Recorder, name: str):
        self._rec = rec
        self._name = name

    def __enter__(self) -> _Span:
        self._start = _now()
        return self

    def __exit__(self, *exc: object) -> None:
        rec = self._rec
        if rec.enabled:
            start = self._start
            rec._append("span", (self._name, start, _now() - start))


class Recorder:
    """Per-rank store of metric records.

    ``comm`` is a :class:`~clusterkernel.metrics._ring.CommRing`: preallocated rows in
    ``COMM_FIELDS`` order, written in place by :meth:`timing` (the comm layer's ledger)
    and by the C fast path, so a comm call allocates nothing to be recorded; indexing
    it gives tuples. ``scalars`` and ``spans`` are lists of tuples. When a kind holds
    more than ``capacity`` records its oldest go (the ring's oldest, one at a time; a
    list's oldest half), counted in ``dropped``, so a long run cannot exhaust memory;
    a live stream has normally sent those records on long before, and reports any it
    had not (see :meth:`read`).

    Example::

        rec = Recorder(rank=0)
        rec.log(step=1, loss=0.5)
        rec.records()  # [{"kind": "scalar", "rank": 0, "step": 1, ...}]
    """

    def __init__(self, rank: int | None = None, capacity: int = DEFAULT_CAPACITY):
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self.rank = _detect_rank() if rank is None else rank
        self.capacity = capacity
        self.enabled = True
        self.comm = _CommView(CommRing(capacity))
        self.scalars: list[tuple] = []
        self.spans: list[tuple] = []
        self._lists = {"scalar": self.scalars, "span": self.spans}
        self._cursor = dict.fromkeys(KINDS, 0)  # drain(): absolute index of the next record
        self._dropped = dict.fromkeys(KINDS, 0)
        self._step = 0
        # Taken by trim and by readers in other threads (the stream), never by the
        # append path: appends only grow the lists, which a reader tolerates.
        self._lock = threading.Lock()
        # records no longer in the lists (trimmed or cleared): absolute index base
        self._gone = dict.fromkeys(KINDS, 0)
        # (cell, comm index, scalar index, span index): where each cell's records start
        # (absolute indices), one tuple per cell run in the rank's IPython (see mark_cell)
        self.cells: list[tuple[str, int, int, int]] = []

    @property
    def ring(self) -> CommRing:
        """The comm records' ring (the C fast path writes it)."""
        return self.comm.ring

    @property
    def dropped(self) -> dict[str, int]:
        """Records of each kind dropped to stay within ``capacity`` (not cleared ones)."""
        ring = self.comm.ring
        out = dict(self._dropped)
        out["comm"] = max(0, ring.total() - ring.capacity - self._gone["comm"])
        return out

    def _append(self, kind: str, item: tuple) -> None:
        store = self._lists[kind]
        store.append(item)
        if len(store) > self.capacity:
            self.trim(kind)

    def trim(self, kind: str) -> None:
        """Drop the oldest half of a list kind's records (called when over capacity;
        the comm ring drops its oldest record by itself)."""
        if kind == "comm":
            return
        with self._lock:
            store = self._lists[kind]
            half = len(store) // 2
            del store[:half]
            self._dropped[kind] += half
            self._gone[kind] += half

    def _first(self, kind: str) -> int:
        """The absolute index of the oldest record of ``kind`` kept."""
        if kind == "comm":
            return self.comm.ring.first()
        return self._gone[kind]

    def _slice(self, kind: str, lo: int, hi: int) -> list[tuple]:
        """Records ``lo`` to ``hi`` of ``kind`` (absolute, within what is kept); under the lock."""
        if kind == "comm":
            return self.comm.ring.rows(lo, hi)
        base = self._gone[kind]
        return self._lists[kind][lo - base : hi - base]

    def total(self, kind: str) -> int:
        """How many records of ``kind`` were ever appended (kept plus dropped)."""
        if kind == "comm":
            return self.comm.ring.total()
        with self._lock:
            return self._gone[kind] + len(self._lists[kind])

    def read(self, kind: str, start: int, limit: int | None = None) -> tuple[list[tuple], int, int]:
        """Raw tuples of ``kind`` from absolute index ``start``: ``(items, next, lost)``.

        ``next`` is the index to pass next time; ``lost`` counts records between
        ``start`` and the oldest kept one (trimmed, overwritten or cleared before this
        reader got them).
        Thread-safe against :meth:`trim`; does not touch the :meth:`drain` cursor.

        Example::

            items, nxt, lost = rec.read("scalar", 0)   # everything kept so far
        """
        _kinds(kind)
        with self._lock:
            total = self._total(kind)
            lo = max(start, self._first(kind))
            hi = total if limit is None else min(total, lo + limit)
            items = self._slice(kind, lo, hi) if hi > lo else []
        lo = max(hi - len(items), lo)  # the ring's rows written over while read: lost too
        return items, max(hi, start), max(lo - start, 0)

    def _total(self, kind: str) -> int:
        if kind == "comm":
            return self.comm.ring.total()
        return self._gone[kind] + len(self._lists[kind])

    def mark_cell(self, cell: str) -> None:
        """Records from now on belong to ``cell`` (the dashboard draws each cell's
        records as a run of their own). Called before each cell on an engine.

        Example::

            rec.mark_cell("ck-cell 3f2a")   # what the engine's pre_run_cell hook does
        """
        with self._lock:
            at = tuple(self._total(k) for k in KINDS)
        self.cells.append((cell, *at))

    def timing(
        self,
        op: str,
        nbytes: int,
        start: float,
        duration: float,
        wait: float = 0.0,
        algorithm: str = "mpi",
        group_size: int = 1,
    ) -> None:
        """Record one communication event of your own (the comm layer's record shape).

        ``start`` is a ``time.perf_counter()`` reading; the dashboard's panels and
        the Chrome trace show the event next to the comm layer's own.

        Example::

            from mpi4py import MPI
            left, right = (comm.rank() - 1) % comm.size(), (comm.rank() + 1) % comm.size()
            edge, halo = np.ones(1024), np.empty(1024)     # 8192 bytes each way
            t0 = time.perf_counter()
            MPI.COMM_WORLD.Sendrecv(edge, right, recvbuf=halo, source=left)   # raw mpi4py
            metrics.recorder().timing("halo", edge.nbytes, t0, time.perf_counter() - t0)
        """
        if self.enabled:  # one row written in place (the comm layer writes the ring directly)
            self.comm.ring.write(
                op=op,
                nbytes=nbytes,
                algorithm=algorithm,
                group_size=group_size,
                start=start,
                duration=duration,
                wait=wait,
            )

    def log(self, step: int | None = None, **scalars: float) -> None:
        """Record scalar values (loss, accuracy, ...) at a training step.

        Without ``step`` the recorder counts calls. ``samples=n`` (or ``batch_size=n``):
        samples processed since the previous such call; the dashboard shows
        ``samples_per_s`` from it. Example: ``rec.log(step=5, loss=0.3, samples=64)``.
        """
        if not scalars:
            raise ValueError("log() needs at least one value, e.g. log(step=1, loss=0.5)")
        if step is None:
            step = self._step
        self._step = step + 1
        if self.enabled:
            values = {k: _to_number(k, v) for k, v in scalars.items()}
            self._append("scalar", (step, _now(), values))

    def span(self, name: str) -> _Span:
        """Context manager timing a named block of compute: ``with rec.span("backward"):``."""
        return _Span(self, name)

    def _to_dicts(self, kind: str, items: list[tuple]) -> list[dict]:
        rank = self.rank
        if kind == "comm":
            return [comm_record(rank, t) for t in items]
        if kind == "scalar":
            return [scalar_record(rank, s, t, v) for s, t, v in items]
        return [span_record(rank, n, s, d) for n, s, d in items]

    def records(self, kind: str | None = None) -> list[dict]:
        """All kept records (of one kind, or all kinds), as dicts; does not move cursors."""
        out: list[dict] = []
        for k in _kinds(kind):
            with self._lock:
                items = self._slice(k, self._first(k), self._total(k))
            out.extend(self._to_dicts(k, items))
        return out

    def drain(self, kind: str | None = None) -> list[dict]:
        """Records added since the previous drain (of one kind, or all kinds)."""
        out: list[dict] = []
        for k in _kinds(kind):
            with self._lock:
                end = self._total(k)
                items = self._slice(k, max(self._cursor[k], self._first(k)), end)
                self._cursor[k] = end
            out.extend(self._to_dicts(k, items))
        return out

    def clear(self) -> None:
        """Forget every record and reset the cursors."""
        with self._lock:
            ring = self.comm.ring
            ring.clear()
            self._gone["comm"] = ring.total()
            self._cursor["comm"] = ring.total()
            for k, store in self._lists.items():
                self._gone[k] += len(store)
                store.clear()
                self._cursor[k] = self._gone[k]
                self._dropped[k] = 0


class _CommView:
    """``Recorder.comm``: the kept comm records as a read-only sequence of tuples
    (``COMM_FIELDS`` order) over the ring: ``rec.comm[-1]``, ``len(rec.comm)``."""

    __slots__ = ("ring",)

    def __init__(self, ring: CommRing) -> None:
        self.ring = ring

    def __len__(self) -> int:
        ring = self.ring
        return ring.total() - ring.first()

    def __getitem__(self, index: int | slice) -> tuple | list[tuple]:
        ring = self.ring
        lo, n = ring.first(), len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            rows = ring.rows(lo + start, lo + max(stop, start))
            return rows[::step]
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("comm record index out of range")
        return ring.rows(lo + i, lo + i + 1)[0]

    def __iter__(self):
        ring = self.ring
        return iter(ring.rows(ring.first(), ring.total()))


def _kinds(kind: str | None) -> tuple[str, ...]:
    if kind is None:
        return KINDS
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; use one of {KINDS}")
    return (kind,)


def _to_number(name: str, value: Any) -> float:
    try:
        return float(value)  # also takes 0-d tensors and numpy scalars
    except (TypeError, ValueError):
        raise TypeError(
            f"log(): value {name}={value!r} is not a number; pass floats, e.g. loss=loss.item()"
        ) from None


_RECORDER: Recorder | None = None


def _follow_engine_cells() -> None:
    """Hook the recorder to the engine's cells if it was made before the engine's
    kernel existed (the warm start imports ``comm``, whose ledger makes it); called
    once per engine by its set-up (:mod:`clusterkernel.rank._engine_setup`)."""
    if _RECORDER is not None:
        _cells.follow(_RECORDER)


def recorder() -> Recorder:
    """This process's recorder (created on first use).

    Made, it also marks the cells an engine runs (one run each on the dashboard) and
    runs what other libraries attached (:mod:`._attached`: with torchdist imported, the
    gradient all-reduces of DDP models made afterwards are timed)."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
        _cells.follow(_RECORDER)
        _attached.recording()
    return _RECORDER


def enable(on: bool = True) -> None:
    """Turn recording on or off for this process: ``metrics.enable(False)``."""
    recorder().enabled = bool(on)


def log(step: int | None = None, **scalars: float) -> None:
    """Log scalars on this rank: ``clusterkernel.log(step=i, loss=loss.item())``."""
    recorder().log(step, **scalars)


def span(name: str) -> _Span:
    """Time a block of compute on this rank: ``with metrics.span("forward"): ...``."""
    return recorder().span(name)


def stream(address: str, key: bytes, interval: float = 0.1) -> dict:
    """Stream this rank's records to a notebook listening at ``address`` (a thread).

    Batched every ``interval`` seconds, JSON signed with ``key``; logging never
    waits for it. :class:`clusterkernel.Dashboard` calls this on every rank; a
    second call with the same address is a no-op. Returns this rank's identity.

    Example::

        # not run: it needs a notebook listening at the address (a Dashboard)
        metrics.stream("tcp://127.0.0.1:5555", key=b"secret")
    """
    from clusterkernel.metrics import _stream

    return _stream.start(address, key, recorder(), interval)


def stop_stream() -> None:
    """Send what is left and stop this rank's stream (no-op if none runs)."""
    from clusterkernel.metrics import _stream

    _stream.stop()


def flush_stream(timeout: float = 10.0) -> int:
    """Send everything recorded so far now; return the last message's sequence number."""
    from clusterkernel.metrics import _stream

    return _stream.flush(timeout)
