"""Notebook side of the metric stream: a PULL socket and a thread that fills the store.

The socket binds to loopback on a free port for a cluster on this machine (on all
interfaces for several hosts, where ranks elsewhere must reach it). Every message
is checked against the HMAC key before it is parsed (``clusterkernel.protocol._wire``);
messages that fail are counted in ``rejected`` and dropped unread.

It runs in its own thread, so records arrive while ``%%mpi`` blocks the
notebook's main thread.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import threading

import zmq

from clusterkernel.client.dashboard._store import MetricsStore
from clusterkernel.protocol import _wire


def lower_thread_priority(niceness: int = 10) -> None:
    """Nice the calling thread (Linux only; elsewhere it would nice the whole process).

    The dashboard's threads share cores with the ranks when both run on one machine.
    A thread that wakes up preempts a rank, and with MPI that stalls every rank in the
    next collective; niced, the scheduler lets the rank finish its slice first.
    """
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        except OSError:
            pass


def _advertised_ip(bind_ip: str) -> str:
    if bind_ip not in ("0.0.0.0", "*"):
        return bind_ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Receiver:
    """Receive signed metric messages into ``store`` from a background thread.

    Example::

        rx = Receiver(MetricsStore()).start()
        rx.address, rx.key      # what each rank's metrics.stream() needs
        rx.stop()
    """

    def __init__(
        self, store: MetricsStore, bind_ip: str = "127.0.0.1", period: float = 0.1
    ) -> None:
        self.store = store
        self.period = period
        self.key = secrets.token_bytes(32)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        # bounded here too: past this, the ranks hold records back (never drop them)
        self._sock.setsockopt(zmq.RCVHWM, 256)
        host = "*" if bind_ip in ("0.0.0.0", "*") else bind_ip
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{_advertised_ip(bind_ip)}:{port}"
        self.received = 0
        self.rejected = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Receiver:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="clusterkernel-receiver", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        lower_thread_priority()
        sock = self._sock
        try:
            # Wake on a fixed cadence and take everything queued, rather than once
            # per message: fewer wake-ups, each of which can preempt a rank.
            while not self._stop.wait(self.period):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(frames)
        finally:
            sock.close()
            self._ctx.term()

    def _handle(self, frames: list[bytes]) -> None:
        try:
            msg = _wire.decode(self.key, frames, columns=True)
        except (_wire.WireError, ValueError):
            self.rejected += 1
            return
        try:
            self.store.ingest(msg)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.rejected += 1
            self.error = exc
            return
        self.received += 1

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the socket. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        elif not self._sock.closed:
            self._sock.close()
            self._ctx.term()
