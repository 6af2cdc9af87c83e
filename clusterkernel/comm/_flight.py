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
from collections import deque

import torch

from clusterkernel.comm._groups import Group
from clusterkernel.comm._ledger import CODE, DONE, DTYPE, GROUP, LASTI, NBYTES, OP, PEER, SEQ

DEFAULT_SIZE = 64
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames skipped when looking for the line that made a call: clusterkernel's own
# (training modes, DataParallel hooks) and torch's (autograd running those hooks).
_SKIP = (_PACKAGE + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
# clusterkernel's source files: a set lookup on the first frame is cheaper than a
# prefix test, and the first frame is the user's for every direct call.
OURS = frozenset(
    os.path.join(root, name)
    for root, _, names in os.walk(_PACKAGE)
    for name in names
    if name.endswith(".py")
)
_getframe = sys._getframe


def _outside(f):
    """The first frame, from ``f`` outwards, outside clusterkernel and torch."""
    skip = _SKIP
    while f is not None and f.f_code.co_filename.startswith(skip):
        f = f.f_back
    return f


def _line(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line or 0
    return 0


class FlightRecorder:
    """A ring of the last ``size`` calls on this rank (see the module docstring)."""

    __slots__ = ("ring", "on")

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.ring = deque(maxlen=size)
        self.on = os.environ.get("CLUSTERKERNEL_FLIGHT", "1") not in ("0", "off")

    def record(
        self,
        group: Group,
        op: str,
        nbytes: int,
        dtype: object,
        peer: int | None = None,
        depth: int = 2,
        advance: bool = True,
    ) -> list:
        """Note one call as it starts; returns the entry (mark it done with ``e[DONE]``).

        ``peer`` is set for point-to-point calls (a world rank, -1 for any source);
        those get no sequence number. ``depth`` is the number of clusterkernel frames
        between this call and the user's: the frame there is checked and, if it is
        still clusterkernel's, the walk goes on outwards (so a call from a training
        mode names the cell that ran it). It must not be larger than the true
        depth. ``advance=False`` gives the entry the number of the group's next
        collective instead of taking one (work that call does first, such as
        ``auto``'s set-up). Callers test :attr:`on` first.
        """
        if peer is None:  # collectives: the per-group order every member shares
            seq = group._calls
            if advance:
                group._calls = seq + 1
        else:
            seq = -1
        f = _getframe(depth)
        code = f.f_code
        if code.co_filename in OURS:
            f = _outside(f)
            if f is None:
                entry = [seq, op, group, nbytes, dtype, peer, None, 0, False]
                self.ring.append(entry)
                return entry
            code = f.f_code
        # code and offset, not the frame: a frame would keep the caller's tensors alive
        entry = [seq, op, group, nbytes, dtype, peer, code, f.f_lasti, False]
        self.ring.append(entry)
        return entry

    def snapshot(self) -> list[dict]:
        """The kept calls, oldest first, as plain dicts (safe to send to the client)."""
        out = []
        for e in list(self.ring):  # one copy: the main thread may append meanwhile
            group = e[GROUP]
            dtype = e[DTYPE]
            out.append(
                {
                    "seq": e[SEQ],
                    "op": e[OP],
                    "group": group.name,
                    "group_ranks": list(group.ranks),
                    "group_instance": group.instance,
                    "nbytes": e[NBYTES],
                    "dtype": str(dtype).replace("torch.", "") if dtype is not None else "",
                    "peer": e[PEER],  # None for collectives
                    "file": e[CODE].co_filename if e[CODE] is not None else "",
                    "line": _line(e[CODE], e[LASTI]) if e[CODE] is not None else 0,
                    "done": e[DONE],
                }
            )
        return out

    def clear(self) -> None:
        self.ring.clear()


FLIGHT = FlightRecorder()


def flight() -> list[dict]:
    """This rank's last communication calls, oldest first (see the module docstring).

    Example::

        comm.barrier()
        comm.flight()[-1]["op"]   # 'barrier'
    """
    return FLIGHT.snapshot()


def set_flight(on: bool = True, size: int | None = None) -> None:
    """Turn the flight recorder on or off on this rank, or resize its ring.

    Example: ``comm.set_flight(size=256)`` keeps the last 256 calls.
    """
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        FLIGHT.ring = deque(maxlen=size)
    FLIGHT.on = bool(on)
