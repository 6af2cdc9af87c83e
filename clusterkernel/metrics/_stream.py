"""Engine side of the live metric stream: a thread that ships the recorder's records.

While a cell runs, the engine's main thread is busy with the user's loop, so the
stream runs in a thread of its own. Every ``interval`` it reads what the recorder
gained since the last send (by absolute index, see ``Recorder.read``), packs it
into one signed message of binary columns (``clusterkernel.protocol._wire``) and pushes it on a ZMQ PUSH
socket to the notebook's PULL socket.

Why this cannot slow or block the training loop, and why nothing is lost:

- logging is a tuple appended to a list; the stream only reads the lists;
- the recorder itself is the buffer: if the notebook is slow, sends stop at the
  socket's high-water mark (``zmq.NOBLOCK``), one message waits in the thread
  and the read index simply stays behind, so no record is skipped; memory stays
  bounded by the recorder's capacity, and records trimmed before they were sent
  are counted in the next message's ``lost`` field, so the notebook says so;
- a message holds at most ``max_batch`` records per kind, so a backlog goes out
  in pieces rather than as one huge message.

Engine side: imports zmq and psutil, never IPython display code or mpi4py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import psutil
import zmq

from clusterkernel.metrics import _attached
from clusterkernel.protocol import _wire
from clusterkernel.protocol.records import KINDS

if TYPE_CHECKING:  # the recorder is handed in: this module never imports metrics
    from clusterkernel.metrics import Recorder

_HWM = 64  # messages queued in ZMQ before sends wait in the thread
_BEAT = 1.0  # seconds: send process stats this often even with no new records


class Publisher:
    """Push one rank's records to ``address`` from a background thread.

    Example (what ``metrics.stream`` does on each rank)::

        pub = Publisher("tcp://127.0.0.1:5555", key=b"k", recorder=metrics.recorder())
        pub.start()
        ...
        pub.flush()   # everything recorded so far is on the wire
        pub.stop()
    """

    def __init__(
        self,
        address: str,
        key: bytes,
        recorder: Recorder,
        interval: float = 0.1,
        max_batch: int = 1_000,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.address = address
        self.key = key
        self.recorder = recorder
        self.interval = interval
        self.max_batch = max_batch
        self.seq = 0  # messages sent
        self.sent = dict.fromkeys(KINDS, 0)  # absolute index of the next record to send
        self.cells_sent = 0  # the recorder's cell marks sent so far
        self.lost = dict.fromkeys(KINDS, 0)
        self.full_waits = 0  # ticks where the socket was full (the notebook lagged)
        # (frames, read indices after it, lost counts): the one message waiting to go
        self._pending: tuple[list[bytes], dict[str, int], dict[str, int]] | None = None
        self._last_send = 0.0
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first reading is meaningless
        self._ident = {"host": socket.gethostname(), "pid": os.getpid()}
        self._stats: dict = {**self._ident, "cpu": None, "rss_mib": None}
        self._stats_at = 0.0
        self._collected_at = 0.0
        self._wake = threading.Event()
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> Publisher:
        self._thread = threading.Thread(target=self._run, name="clusterkernel-stream", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.LINGER, 2000)  # on stop, give queued messages 2 s to leave
        sock.connect(self.address)
        try:
            while True:
                self._wake.wait(self.interval)
                self._wake.clear()
                stopping = self._stopping
                try:
                    self._tick(sock, final=stopping)
                except Exception as exc:  # keep streaming; the notebook sees the error
                    self.error = exc
                if stopping:
                    return
        finally:
            sock.close()
            ctx.term()

    def _message(self) -> tuple[dict, dict[str, int]]:
        rec = self.recorder
        msg: dict = {"v": _wire.VERSION, "rank": rec.rank}
        upto = {}
        lost = {}
        at = {}
        for kind in KINDS:
            items, nxt, skipped = rec.read(kind, self.sent[kind], self.max_batch)
            msg[kind] = items
            upto[kind] = nxt
            at[kind] = nxt - len(items)
            lost[kind] = self.lost[kind] + skipped
        msg["lost"] = lost
        msg["at"] = at  # absolute index of each kind's first record here
        # read after the records: a record read above has its cell's mark in here
        cells = rec.cells[self.cells_sent :]
        msg["cells"] = [list(c) for c in cells]
        upto["cells"] = self.cells_sent + len(cells)
        return msg, upto

    def _tick(self, sock: zmq.Socket, final: bool = False) -> None:
        """Send the waiting message, then as many new batches as the socket takes."""
        self._collect_attached(final)
        while True:
            if self._pending is None:
                msg, upto = self._message()
                has_records = any(msg[k] for k in KINDS)
                now = time.perf_counter()
                if not has_records and now - self._last_send < _BEAT and not final:
                    return
                msg["seq"] = self.seq + 1
                msg["pc"], msg["wall"] = now, time.time()
                msg["proc"] = self._proc_stats()
                self._pending = (_wire.encode(self.key, msg), upto, msg["lost"])
            frames, upto, lost = self._pending
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.full_waits += 1
                return  # the recorder keeps the records; try again next tick
            self._pending = None
            self._last_send = time.perf_counter()
            with self._cond:
                self.seq += 1
                self.cells_sent = upto.pop("cells")
                self.sent = upto
                self.lost = dict(lost)
                self._cond.notify_all()
            if final:
                final = False  # one closing message is enough; loop for any backlog
            # Hand the GIL back between messages: the rank's main thread, back from
            # an MPI call, must not wait for a whole backlog to be packed (the other
            # ranks would wait for it in the next collective).
            time.sleep(0)
            if all(self.recorder.total(k) <= self.sent[k] for k in KINDS):
                return

    def _collect_attached(self, final: bool) -> None:
        """What other libraries attached (:mod:`._attached`; torchdist: torch's timed
        collectives) into the recorder, once a second at most (reading torch's flight
        recorder takes the GIL from the training loop)."""
        if not _attached.collecting():
            return
        now = time.perf_counter()
        if now - self._collected_at < _BEAT and not final:
            return
        self._collected_at = now
        _attached.collect(self.recorder)

    def _proc_stats(self) -> dict:
        now = time.perf_counter()
        if now - self._stats_at >= _BEAT:  # /proc reads once a second are plenty
            self._stats_at = now
            try:
                with self._proc.oneshot():
                    cpu = self._proc.cpu_percent(None)
                    rss = self._proc.memory_info().rss / 2**20
            except psutil.Error:
                cpu = rss = None
            self._stats = {**self._ident, "cpu": cpu, "rss_mib": rss}
        return self._stats

    def flush(self, timeout: float = 10.0) -> int:
        """Block until every record appended so far is sent; return the last ``seq``."""
        target = {k: self.recorder.total(k) for k in KINDS}
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(self.sent[k] >= target[k] for k in KINDS):
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    raise TimeoutError(
                        f"metrics stream of rank {self.recorder.rank} could not send its "
                        f"records within {timeout:g}s (is the notebook's dashboard closed?)"
                    )
                self._wake.set()
                self._cond.wait(min(left, self.interval))
            return self.seq

    def stop(self, timeout: float = 5.0) -> None:
        """Send a last message with what is left, then end the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)


_PUBLISHER: Publisher | None = None


def start(address: str, key: bytes, recorder: Recorder, interval: float = 0.1) -> dict:
    """Stream ``recorder`` to ``address`` (replacing a stream to another); return identity."""
    global _PUBLISHER
    pub = _PUBLISHER
    alive = pub is not None and pub._thread is not None and pub._thread.is_alive()
    if not (alive and pub.address == address and pub.key == key):
        if pub is not None:
            pub.stop()
        _PUBLISHER = Publisher(address, key, recorder, interval=interval).start()
    return {"rank": recorder.rank, "host": socket.gethostname(), "pid": os.getpid()}


def stop() -> None:
    global _PUBLISHER
    if _PUBLISHER is not None:
        _PUBLISHER.stop()
        _PUBLISHER = None


def flush(timeout: float = 10.0) -> int:
    if _PUBLISHER is None:
        raise RuntimeError("no metrics stream on this rank; start one with metrics.stream()")
    return _PUBLISHER.flush(timeout)


def publisher() -> Publisher | None:
    """This process's running publisher, if any (for tests and benchmarks)."""
    return _PUBLISHER
