"""The flight recorder: each rank's last communication calls, for the hang report.

Every call into ``comm`` notes, as it starts: the op, a sequence number counted per
group (collectives run in the same order on every member, so ``all_reduce #57`` on
rank 0 and on rank 2 are the same call), bytes, dtype, the peer of a point-to-point
call, and the line that called it (the first frame outside clusterkernel and torch:
the cell's line, or the user's script). It is marked done when it completes. A
fixed ring of the last :data:`DEFAULT_SIZE` calls; reading it (:func:`snapshot`)
works from another thread while the main thread is blocked in MPI, which is how the
client's hang report gets it.

On by default: noting a call costs well under a microsecond (BENCHMARKS.md, issue 12).

Example::

    from clusterkernel.comm import flight
    comm.all_reduce(torch.ones(4))
    flight()[-1]   # {'seq': 0, 'op': 'all_reduce', 'group': 'world', 'nbytes': 16, ...}
"""

from __future__ import annotations

import os
import sys
import time

import torch

_now = time.perf_counter
DEFAULT_SIZE = 64
# Frames skipped when looking for the line that made a call: clusterkernel's own
# (training modes, DataParallel hooks) and torch's (autograd running those hooks).
_SKIP = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)
# Entry layout: a list, so completion can flip DONE in place without a lookup.
SEQ, OP, GROUP, NBYTES, DTYPE, PEER, CODE, LINE, T0, DONE = range(10)


class FlightRecorder:
    """A ring of the last ``size`` calls on this rank (see the module docstring)."""

    __slots__ = ("ring", "size", "count", "on")

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self.ring: list[list | None] = [None] * size
        self.count = 0
        self.on = os.environ.get("CLUSTERKERNEL_FLIGHT", "1") not in ("0", "off")

    def record(
        self, group, op: str, nbytes: int, dtype: object, peer: int | None = None
    ) -> list | None:
        """Note one call as it starts; returns the entry (mark it done with ``e[DONE]``).

        ``peer`` is set for point-to-point calls (a world rank, -1 for any source);
        those get no sequence number.
        """
        if not self.on:
            return None
        if peer is None:  # collectives: the per-group order every member shares
            seq = group._calls
            group._calls = seq + 1
        else:
            seq = -1
        f = sys._getframe(1)
        skip = _SKIP
        while f is not None and f.f_code.co_filename.startswith(skip):
            f = f.f_back
        if f is None:
            code, line = None, 0
        else:
            code, line = f.f_code, f.f_lineno
        entry = [seq, op, group, nbytes, dtype, peer, code, line, _now(), False]
        self.ring[self.count % self.size] = entry
        self.count += 1
        return entry

    def snapshot(self) -> list[dict]:
        """The kept calls, oldest first, as plain dicts (safe to send to the client)."""
        n, size = self.count, self.size
        ring = list(self.ring)  # one copy: the main thread may append meanwhile
        entries = [ring[i % size] for i in range(max(0, n - size), n)]
        now = _now()
        out = []
        for e in entries:
            if e is None:
                continue
            group = e[GROUP]
            dtype = e[DTYPE]
            out.append(
                {
                    "seq": e[SEQ],
                    "op": e[OP],
                    "group": group.name,
                    "group_ranks": list(group.ranks),
                    "nbytes": e[NBYTES],
                    "dtype": str(dtype).replace("torch.", "") if dtype is not None else "",
                    "peer": e[PEER],  # None for collectives
                    "file": e[CODE].co_filename if e[CODE] is not None else "",
                    "line": e[LINE],
                    "done": e[DONE],
                    "age": now - e[T0],
                }
            )
        return out

    def clear(self) -> None:
        self.ring = [None] * self.size
        self.count = 0


FLIGHT = FlightRecorder()


def flight() -> list[dict]:
    """This rank's last communication calls, oldest first (see the module docstring).

    Example: ``comm.flight()[-1]["op"]`` is the op of the latest call.
    """
    return FLIGHT.snapshot()


def set_flight(on: bool = True, size: int | None = None) -> None:
    """Turn the flight recorder on or off on this rank, or resize its ring.

    Example: ``comm.set_flight(size=256)`` keeps the last 256 calls.
    """
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        FLIGHT.size = size
        FLIGHT.clear()
    FLIGHT.on = bool(on)
