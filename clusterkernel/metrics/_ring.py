"""The comm records' ring: preallocated storage written in place, nothing allocated per call.

A comm record has the layout :data:`~clusterkernel.protocol.records.COMM_LAYOUT`
declares (its fields, in order, with their types). :class:`CommRing` stores records as
fixed rows of that layout in one anonymous memory map: a ``str`` field as the code of
its name (:meth:`CommRing.code`, names kept in :attr:`CommRing.names`), an ``int`` as
int64, a ``float`` as a double; a header int64 counts the records ever written. A
write takes the next slot (moves the count on) and packs one row there: no tuple, no
float object is kept per call, and the C fast path (``comm/_fast.c``) writes the same
rows directly, at the offsets :attr:`CommRing.offsets` gives it. When the ring is full
the oldest record is overwritten (the recorder counts it as dropped).

Readers (:meth:`CommRing.rows`) read by absolute index, as the recorder's lists are
read, and get plain tuples in ``COMM_FIELDS`` order. A reader in another thread (the
live stream) that is lapped by the writer while it reads drops the rows written over
(reported as lost), never a mix of two records. The memory is mapped, not allocated:
pages are taken as records reach them, so a large capacity costs only what is used.

Example::

    ring = CommRing(capacity=4)
    ring.append(("all_reduce", 64, "mpi", 2, 1.0, 2e-6, 2e-6))
    ring.rows(0, ring.total())   # [('all_reduce', 64, 'mpi', 2, 1.0, 2e-06, 2e-06)]
"""

from __future__ import annotations

import mmap
import struct

from clusterkernel.protocol.records import COMM_LAYOUT

# a row's C type per field type of the layout (native order: only this process reads it)
_TYPECODE = {"str": "q", "int": "q", "float": "d"}
FORMAT = "=" + "".join(_TYPECODE[typ] for _, typ in COMM_LAYOUT)
ROW = struct.calcsize(FORMAT)
HEADER = 8  # the count of records ever written, int64, at offset 0
_STR_AT = tuple(i for i, (_, typ) in enumerate(COMM_LAYOUT) if typ == "str")


def _writer_source() -> str:
    """The source of :meth:`CommRing.write`, made from the layout: one argument per
    field, named as the field, packed in the layout's order (a ``str`` field as its
    code). Made, not written out, so the layout stays declared in one place; made
    once at import."""
    args = ", ".join(name for name, _ in COMM_LAYOUT)
    # Another thread (a DDP hook's future, a user's thread calling comm) or the C path
    # may write between any two calls here (the GIL is handed over after a call), never
    # between two subscripts: so names are coded first (self.code may run Python), then
    # the slot is claimed in two subscripts with no call between, then packed. Packing
    # before claiming lost a record whenever a write came in after the pack: both wrote
    # slot n and the count moved on once.
    codes = "".join(
        f"    if {name} not in codes:\n        self.code({name})\n"
        for name, typ in COMM_LAYOUT
        if typ == "str"
    )
    values = ", ".join(f"codes[{name}]" if typ == "str" else name for name, typ in COMM_LAYOUT)
    return (
        f"def write(self, {args}):\n"
        "    codes = self._codes\n"
        f"{codes}"
        "    count = self._count\n"
        "    n = count[0]\n"
        "    count[0] = n + 1\n"
        "    try:\n"
        f"        self._pack(self.mem, {HEADER} + (n % self.capacity) * {ROW}, {values})\n"
        "    except BaseException:\n"
        "        count[0] = n  # a bad value: nothing recorded (no write came in since)\n"
        "        raise\n"
    )


def _coded_writer_source() -> str:
    """The source of :meth:`CommRing.write_codes`: :meth:`CommRing.write` for a caller
    that holds its ``str`` fields' codes already (a plan keeps its op's and algorithm's),
    so the write is the claim and one pack."""
    args = ", ".join(name for name, _ in COMM_LAYOUT)
    return (
        f"def write_codes(self, {args}):\n"
        "    count = self._count\n"
        "    n = count[0]\n"
        "    count[0] = n + 1\n"
        "    try:\n"
        f"        self._pack(self.mem, {HEADER} + (n % self.capacity) * {ROW}, {args})\n"
        "    except BaseException:\n"
        "        count[0] = n\n"
        "        raise\n"
    )


_ns: dict = {}
exec(_writer_source(), _ns)  # noqa: S102 - our own source, from the layout above
exec(_coded_writer_source(), _ns)  # noqa: S102 - likewise
_write = _ns["write"]
_write_codes = _ns["write_codes"]


def _offsets() -> tuple[tuple[str, str, int], ...]:
    out, at = [], 0
    for name, typ in COMM_LAYOUT:
        out.append((name, typ, at))
        at += struct.calcsize("=" + _TYPECODE[typ])
    return tuple(out)


class CommRing:
    """``capacity`` comm records in place (see the module docstring)."""

    __slots__ = ("capacity", "mem", "names", "_codes", "_count", "_row", "_pack", "base")

    #: ``(field, type, byte offset in a row)`` for each field of the layout, in order
    offsets = _offsets()
    row_size = ROW
    header = HEADER

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self.capacity = capacity
        # private: a process forked from this one (a DataLoader worker) gets its own
        # copy on write, not this process's records (mmap's default is a shared map)
        self.mem = mmap.mmap(-1, HEADER + capacity * ROW, flags=mmap.MAP_PRIVATE)
        self._count = memoryview(self.mem)[:HEADER].cast("q")
        self._row = struct.Struct(FORMAT)
        self._pack = self._row.pack_into
        self.names: list[str] = []  # the name of each code
        self._codes: dict[str, int] = {}
        self.base = 0  # records before this absolute index were cleared

    def code(self, name: str) -> int:
        """The code of a ``str`` field's value (assigned on first use, kept for good)."""
        codes = self._codes
        got = codes.get(name)
        if got is None:
            got = codes[name] = len(self.names)
            self.names.append(name)
        return got

    #: ``write(**fields)``: one record over the oldest slot, its fields by name
    #: (positional in the layout's order works too); made from the layout (_writer_source)
    write = _write
    #: ``write_codes(**fields)``: :meth:`write` with each ``str`` field given as its
    #: :meth:`code` (made from the layout, _coded_writer_source)
    write_codes = _write_codes

    def append(self, row: tuple) -> None:
        """Write one record given as a tuple in the layout's order."""
        self.write(*row)

    def total(self) -> int:
        """Records ever written (kept, overwritten and cleared)."""
        return self._count[0]

    def first(self) -> int:
        """The absolute index of the oldest record kept."""
        return max(self.base, self._count[0] - self.capacity)

    def rows(self, lo: int, hi: int) -> list[tuple]:
        """Records ``lo`` to ``hi`` (absolute indices, clipped to what is kept), as tuples
        in ``COMM_FIELDS`` order."""
        lo = max(lo, self.first())
        hi = min(hi, self._count[0])
        if hi <= lo:
            return []
        cap, mem, unpack = self.capacity, self.mem, self._row.unpack_from
        names = self.names
        out = []
        for n in range(lo, hi):
            values = list(unpack(mem, HEADER + (n % cap) * ROW))
            for i in _STR_AT:
                values[i] = names[values[i]]
            out.append(tuple(values))
        # rows written over while they were read (a writer lapped this reader): dropped
        overrun = self._count[0] - cap - lo
        return out[overrun:] if overrun > 0 else out

    def clear(self) -> None:
        """Forget the records kept (their codes stay)."""
        self.base = self._count[0]
