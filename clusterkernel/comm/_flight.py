"""The flight recorder: each rank's last communication calls, for the hang report.

Every call into ``comm`` notes, as it starts: the op, a sequence number counted per
group (collectives run in the same order on every member, so ``all_reduce #57`` on
rank 0 and on rank 2 are the same call), bytes, dtype, the peer of a point-to-point
call, and the line that called it (the first frame outside clusterkernel and torch:
the cell's line, or the user's script). It is marked done when it completes. A
fixed ring of the last :data:`DEFAULT_SIZE` calls, preallocated and written in place
(no object made per call, in Python or in the C fast path); reading it (:func:`snapshot`)
works from another thread while the main thread is blocked in MPI, which is how the
client's hang report gets it.

On by default: noting a call costs well under a microsecond (BENCHMARKS.md, "What the
flight recorder and the default mismatch check cost").

Example::

    from clusterkernel.comm import flight
    comm.all_reduce(torch.ones(4))
    flight()[-1]   # {'seq': 0, 'op': 'all_reduce', 'group': 'world', 'nbytes': 16, ...}
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable

import torch

from clusterkernel.comm._groups import Group

DEFAULT_SIZE = 64
# A flight entry's layout, declared once: its fields in order, each stored as an int64
# ("int") or an object reference ("obj"). The caller is kept as code and instruction
# offset (not the frame, which would keep the caller's tensors alive); the line is
# worked out only when someone reads it. ``peer`` is None (stored as -2) for a
# collective, ``done`` 0 or 1.
ENTRY_LAYOUT = (
    ("seq", "int"),
    ("op", "obj"),
    ("group", "obj"),
    ("nbytes", "int"),
    ("dtype", "obj"),
    ("peer", "int"),
    ("code", "obj"),
    ("lasti", "int"),
    ("done", "int"),
)
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


# Where an entry's fields are stored (the layout :data:`~._ledger.ENTRY_LAYOUT`
# declares): each slot is a row of int64 (its absolute index first, the "int" fields
# after, in the layout's order) and a row of objects (the "obj" fields, in order).
INT_FIELDS = ("index", *(name for name, typ in ENTRY_LAYOUT if typ == "int"))
OBJ_FIELDS = tuple(name for name, typ in ENTRY_LAYOUT if typ == "obj")
_I = {name: i for i, name in enumerate(INT_FIELDS)}
_O = {name: i for i, name in enumerate(OBJ_FIELDS)}
I_INDEX, I_SEQ, I_NBYTES, I_PEER, I_LASTI, I_DONE = (
    _I[n] for n in ("index", "seq", "nbytes", "peer", "lasti", "done")
)
O_OP, O_GROUP, O_DTYPE, O_CODE = (_O[n] for n in ("op", "group", "dtype", "code"))
NI, NO = len(INT_FIELDS), len(OBJ_FIELDS)
PEER_NONE = -2  # a collective's peer (None); -1 is "any source"
# record() writes a slot's int row in one pack and its object row in one slice (not
# field by field: a subscript of a memoryview costs as much as the whole pack), in the
# order below; a layout that orders its fields otherwise must change record() too
_WRITES = (("index", "seq", "nbytes", "peer", "lasti", "done"), ("op", "group", "dtype", "code"))
if (INT_FIELDS, OBJ_FIELDS) != _WRITES:
    raise ImportError(f"FlightRecorder.record writes {_WRITES}, the layout is {ENTRY_LAYOUT}")
_pack = struct.Struct("=" + "q" * NI).pack_into  # one slot's int64 row
# The C extension's writer of an entry, where it is built and configured (use_writer,
# from _fastpath): the write record() makes in Python below, done as the C path does
# (cheaper than Python's: BENCHMARKS.md, "Collectives"). None: Python's.
_c_write: Callable[..., int] | None = None


def use_writer(write: Callable[..., int] | None = None) -> Callable[..., int] | None:
    """Write entries with ``write`` (``_fast.flight_write``), or in Python (None);
    returns the writer used until now. Both write a slot alike (``tests/comm``).

    Example: ``was = use_writer(None)`` (Python's) ... ``use_writer(was)``.
    """
    global _c_write
    was, _c_write = _c_write, write
    return was


class FlightRecorder:
    """A ring of the last ``size`` calls on this rank (see the module docstring).

    Preallocated: ``ints`` is one bytearray (an int64 count of entries ever noted,
    then ``size`` rows of :data:`INT_FIELDS`), ``objs`` a list of ``size`` rows of
    :data:`OBJ_FIELDS`; noting a call writes one slot in place, here or in the C fast
    path (``_fast.c``, which finds the fields' places from :data:`INT_FIELDS` and
    :data:`OBJ_FIELDS`). An entry is its absolute index (what :meth:`record` returns):
    :meth:`done` marks it only while its slot still holds it, so a late close never
    marks a newer call.
    """

    __slots__ = ("on", "size", "ints", "objs", "_i", "base")

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.on = os.environ.get("CLUSTERKERNEL_FLIGHT", "1") not in ("0", "off")
        self._alloc(size)

    def _alloc(self, size: int, start: int = 0) -> None:
        ints = bytearray(8 * (1 + size * NI))
        view = memoryview(ints).cast("q")
        for slot in range(size):
            view[1 + slot * NI + I_INDEX] = -1  # empty
        # entries go on counting from ``start``: an entry still open from before a
        # resize (an async call) must never name a newer call in the new ring
        view[0] = start
        self.size = size
        self.objs = [None] * (size * NO)
        self.ints = ints
        self._i = view
        self.base = start  # entries before this index were cleared

    def record(
        self,
        group: Group,
        op: str,
        nbytes: int,
        dtype: object,
        peer: int | None = None,
        depth: int = 2,
        advance: bool = True,
    ) -> int:
        """Note one call as it starts; returns the entry (mark it done with :meth:`done`).

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
            peer = PEER_NONE
        else:
            seq = -1
        f = _getframe(depth)
        code = f.f_code
        if code.co_filename in OURS:
            f = _outside(f)
            code = None if f is None else f.f_code
        # code and offset, not the frame: a frame would keep the caller's tensors alive
        lasti = 0 if f is None else f.f_lasti
        write = _c_write
        if write is not None:
            return write(self, seq, op, group, nbytes, dtype, peer, code, lasti)
        ints = self._i
        n = ints[0]
        # claimed before anything that may run other Python code (letting the slot's
        # old objects go may run a finalizer; another thread may then note a call):
        # that call takes the next entry instead of this one's
        ints[0] = n + 1
        slot = n % self.size
        i = 1 + slot * NI
        o = slot * NO
        ints[i] = -1  # being written (I_INDEX): a reader skips it
        self.objs[o : o + NO] = (op, group, dtype, code)
        # the whole int row at once, its index last of all writes: the entry is whole
        _pack(self.ints, 8 * i, n, seq, nbytes, peer, lasti, 0)
        return n

    def done(self, entry: int) -> None:
        """Mark ``entry`` (what :meth:`record` returned) done, if the ring still holds it."""
        ints = self._i
        i = 1 + (entry % self.size) * NI
        if ints[i + I_INDEX] == entry:
            ints[i + I_DONE] = 1

    def snapshot(self) -> list[dict]:
        """The kept calls, oldest first, as plain dicts (safe to send to the client).

        Works from another thread while the main thread notes calls: a slot written
        over while it is read is left out."""
        ints, objs, size = self._i, self.objs, self.size
        n = ints[0]
        out = []
        for k in range(max(self.base, n - size), n):
            slot = k % size
            i, o = 1 + slot * NI, slot * NO
            if ints[i + I_INDEX] != k:
                continue
            seq, nbytes, peer = ints[i + I_SEQ], ints[i + I_NBYTES], ints[i + I_PEER]
            lasti, done = ints[i + I_LASTI], ints[i + I_DONE]
            op, group, dtype, code = objs[o : o + NO]
            if ints[i + I_INDEX] != k:  # written over meanwhile
                continue
            out.append(
                {
                    "seq": seq,
                    "op": op,
                    "group": group.name,
                    "group_ranks": list(group.ranks),
                    "group_instance": group.instance,
                    "nbytes": nbytes,
                    "dtype": str(dtype).replace("torch.", "") if dtype is not None else "",
                    "peer": None if peer == PEER_NONE else peer,
                    "file": code.co_filename if code is not None else "",
                    "line": _line(code, lasti) if code is not None else 0,
                    "done": bool(done),
                }
            )
        return out

    def clear(self) -> None:
        """Forget the kept calls (entries still open are left alone)."""
        self.base = self._i[0]

    def resize(self, size: int) -> None:
        """Keep the last ``size`` calls from now on (the kept ones are forgotten)."""
        self._alloc(size, self._i[0])


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
        FLIGHT.resize(size)
    FLIGHT.on = bool(on)
