"""MPI plumbing shared by the asynchronous modes (parameter server, EASGD, gossip).

- a private duplicate of the group's communicator, with ``MPI.ERRORS_RETURN`` so a
  dead peer surfaces as an exception (when the job runs with Open MPI's
  ``--with-ft ulfm``) instead of aborting every rank;
- the message layout: a 64-byte header of eight int64 fields, then the payload;
- waiting that spins briefly and then sleeps, so a rank that waits leaves the
  CPU to ranks that compute (these modes often run more ranks than cores);
- timing records in the metrics recorder, named after the operation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel import comm, metrics
from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.train._sync import all_objects

HEADER_BYTES = 64
HEADER_FIELDS = HEADER_BYTES // 8
TO_SERVER = 1  # worker -> server; one tag keeps each worker's messages in order
TO_WORKER = 2  # server -> worker
TO_WORKER_ABORT = 4  # server -> worker: the server failed, stop waiting for it
_FAILURE_CLASSES = {MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED}
_now = time.perf_counter


class PeerFailedError(ClusterkernelError, RuntimeError):
    """A rank this one talks to has died (detected by MPI's fault tolerance)."""


def is_failure(exc: MPI.Exception) -> bool:
    """True if ``exc`` reports a dead peer rather than a usage error."""
    return exc.Get_error_class() in _FAILURE_CLASSES


def private_comm(group: comm.Group | None = None) -> MPI.Intracomm:
    """A duplicate of the group's communicator that returns errors (collective)."""
    base = (group or comm.WORLD).member_comm()
    dup = base.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    return dup


def free_comm(link: MPI.Intracomm | None) -> None:
    """Release a communicator from :func:`private_comm` (local; a dead peer is fine)."""
    if link is not None and link != MPI.COMM_NULL:
        try:
            link.Free()
        except MPI.Exception:
            pass  # a communicator with failed ranks may refuse; nothing else to do


def check_same_model(numel: int, dtype: torch.dtype, group: comm.Group | None = None) -> None:
    """Raise on every rank unless all ranks hold models of the same size and dtype.

    Collective. The messages of these modes are sized from the local model, so a
    rank with another model would otherwise break (or hang) the exchange.
    """
    mine = (numel, str(dtype).removeprefix("torch."))
    everyone = all_objects(mine, group)
    if len(set(everyone)) > 1:
        shapes = ", ".join(f"rank {r}: {n} {d}" for r, (n, d) in enumerate(everyone))
        raise ValueError(
            f"ranks hold different models (trainable parameters: {shapes}); build the "
            "same model on every rank"
        )


def message_buffer(payload_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A byte buffer for one message and the int64 view of its header."""
    buf = np.zeros(HEADER_BYTES + payload_bytes, dtype=np.uint8)
    return buf, buf[:HEADER_BYTES].view(np.int64)


class Poller:
    """Spin for ``spin`` seconds after the last activity, then sleep in growing steps.

    A hot MPI wait burns a core; on a machine with more ranks than cores that
    core is taken from a rank that computes. Sleeping costs a little latency.
    """

    __slots__ = ("spin", "max_sleep", "_idle_since", "_sleep")

    def __init__(self, spin: float = 2e-4, max_sleep: float = 1e-3):
        self.spin = spin
        self.max_sleep = max_sleep
        self.busy()

    def busy(self) -> None:
        """Something happened: go back to spinning."""
        self._idle_since = _now()
        self._sleep = 2e-5

    def idle(self) -> None:
        """Nothing happened in this round of polling."""
        if _now() - self._idle_since < self.spin:
            return
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self.max_sleep)


def wait_all(
    reqs: Sequence[MPI.Request],
    what: str,
    peers: Sequence[int],
    poller: Poller,
    abort: MPI.Request | None = None,
) -> None:
    """Wait for every request; a dead peer raises :class:`PeerFailedError`.

    ``peers`` are the ranks the requests talk to (for the error message). If the
    request ``abort`` completes first, the peer gave up: raise instead of waiting.
    """
    poller.busy()
    try:
        while not MPI.Request.Testall(list(reqs)):
            if abort is not None and abort.Test():
                raise RuntimeError(
                    f"{what}: server rank(s) {list(peers)} stopped with an error (see that "
                    "rank's output); this rank cannot go on without it"
                )
            poller.idle()
    except MPI.Exception as exc:
        if is_failure(exc):
            raise PeerFailedError(
                f"{what}: a peer among ranks {list(peers)} has failed ({exc.Get_error_string()}); "
                "this rank cannot go on without it"
            ) from None
        raise


def note(op: str, nbytes: int, peers: int, t0: float, wait: float) -> None:
    """One timing record in the metrics recorder (the comm layer's record shape)."""
    metrics.recorder().timing(op, nbytes, t0, _now() - t0, wait, group_size=peers)
