"""The metric stream's wire format, known to both sides (standard library only).

One message is a list of ZMQ frames: an HMAC-SHA256 signature, a JSON header, then
raw column buffers (int64 / float64 arrays) that the header describes. The
signature covers every frame, with its length, under a key the notebook hands each
rank at setup; the receiver checks it before parsing anything, so whatever else
connects to its port (loopback, but any local user can reach it) is refused
unread. Nothing is ever unpickled: the header is JSON and the columns are plain
numbers.

Why columns and not JSON all the way: a rank that logs in a tight loop makes
records faster than ``json.dumps`` can print floats (``benchmarks/bench_dashboard_encode.py``;
BENCHMARKS.md, "Dashboard"), and the stream's thread would then take the
GIL from the training loop. Packing a batch into arrays is done in C by
``zip``/``array`` and costs a small fraction of that.

:func:`encode` takes and :func:`decode` returns the same message dict::

    {"v": 3, "rank": 0, "seq": 7, "pc": <perf_counter>, "wall": <time.time>,
     "lost": {"comm": 0, "scalar": 0, "span": 0},
     "comm": [(op, nbytes, algorithm, group_size, start, duration, wait), ...],  # COMM_FIELDS
     "scalar": [(step, time, {"loss": 0.4}), ...],
     "span": [(name, start, duration), ...],
     "proc": {"host": "a", "pid": 123, "cpu": 97.0, "rss_mib": 310.2}}

``pc``/``wall`` are read together on the rank, so ``wall - pc`` turns that
rank's ``perf_counter`` times into wall-clock times for a common timeline.

``decode(..., columns=True)`` gives each kind as columns instead of tuples (what
the notebook's store keeps, so receiving costs no Python object per record)::

    "comm":   {"n": 3, "op": Cat(["all_reduce"], array("q", [0, 0, 0])),
               "nbytes": array("q", ...), "algorithm": Cat(...),
               "group_size": array("q", ...), "start": array("d", ...), "duration": ...,
               "wait": ...}

(the comm columns are :data:`~clusterkernel.protocol.records.COMM_LAYOUT`'s fields, by
the same names and in its order: a ``str`` field is a :class:`Cat`, ``int`` ``"q"``,
``float`` ``"d"``)
    "scalar": {"n": 3, "step": array("q", ...), "time": array("d", ...),
               "values": {"loss": array("d", ...)}}   # or "dicts": [{...}, ...]
    "span":   {"n": 3, "name": Cat(...), "start": ..., "duration": ...}

Integer columns are a plain list instead when a value does not fit int64 (a float
step); ``"dicts"`` replaces ``"values"`` when the records of a batch do not all
log the same names. :func:`to_columns` and :func:`to_rows` convert between forms.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from array import array
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.protocol.records import COMM_FIELDS, COMM_LAYOUT, KINDS

# 3: the comm columns carry COMM_LAYOUT's own names (2 called ``algorithm`` ``alg``), so
# a notebook and ranks of different installs are told apart, not mis-read
VERSION = 3
_TYPECODES = ("q", "d")  # the only array types a header may name


class WireError(ClusterkernelError, ValueError):
    """A message that is not signed with our key, or not ours at all."""


class Cat(NamedTuple):
    """A column of strings as its distinct values and one index per record."""

    names: list
    codes: array

    def tolist(self) -> list:
        return list(map(self.names.__getitem__, _seq(self.codes)))


def sign(key: bytes, frames: list[bytes]) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        mac.update(len(frame).to_bytes(8, "little"))
        mac.update(frame)
    return mac.digest()


def _ints(values) -> array | list:
    try:
        return array("q", values)
    except (TypeError, OverflowError):  # a float or huge step: rare, keep it exact
        return list(values)


def _cat(values) -> Cat:
    names = list(dict.fromkeys(values))
    index = {n: i for i, n in enumerate(names)}
    return Cat(names, array("q", map(index.__getitem__, values)))


def to_columns(kind: str, rows: list) -> dict:
    """Records of one kind (tuples as in the module docstring) as columns."""
    if kind == "scalar":
        steps, times, values = zip(*rows)
        cols: dict[str, Any] = {"n": len(rows), "step": _ints(steps), "time": array("d", times)}
        first = values[0].keys()
        if all(v.keys() == first for v in values):
            cols["values"] = {n: array("d", map(itemgetter(n), values)) for n in first}
        else:
            cols["dicts"] = [dict(v) for v in values]
        return cols
    if kind == "comm":
        cols = {"n": len(rows)}
        for (field, typ), values in zip(COMM_LAYOUT, zip(*rows)):
            cols[field] = _COLUMN_OF[typ](values)
        return cols
    if kind == "span":
        name, start, dur = zip(*rows)
        return {
            "n": len(rows),
            "name": _cat(name),
            "start": array("d", start),
            "duration": array("d", dur),
        }
    raise ValueError(f"unknown record kind {kind!r}; use one of {KINDS}")


# a column of each field type of COMM_LAYOUT
_COLUMN_OF = {"str": _cat, "int": _ints, "float": lambda values: array("d", values)}


def _seq(column) -> list:
    return column.tolist() if hasattr(column, "tolist") else list(column)


def to_rows(kind: str, cols: dict) -> list[tuple]:
    """The inverse of :func:`to_columns` (also takes numpy arrays as columns)."""
    if kind == "scalar":
        if "dicts" in cols:
            values = cols["dicts"]
        else:
            names: Sequence[str] = list(cols["values"])
            values = [dict(zip(names, row)) for row in zip(*map(_seq, cols["values"].values()))]
            if not names:
                values = [{} for _ in range(cols["n"])]
        return list(zip(_seq(cols["step"]), _seq(cols["time"]), values))
    if kind == "comm":
        names = COMM_FIELDS
    else:
        names = ("name", "start", "duration")
    return list(zip(*(_seq(cols[n]) for n in names)))


def _spec(value, frames: list[bytes]):
    """JSON for one column value; arrays go to ``frames`` and are named by index."""
    if isinstance(value, Cat):
        return {"cat": value.names, "codes": _spec(value.codes, frames)}
    if isinstance(value, array):
        frames.append(value.tobytes())
        return {"a": value.typecode, "f": len(frames) - 1}
    if isinstance(value, dict):
        return {"d": {k: _spec(v, frames) for k, v in value.items()}}
    return {"j": value}


def encode(key: bytes, message: dict) -> list[bytes]:
    """``[signature, header, *columns]`` frames for one message (rows or columns)."""
    frames: list[bytes] = []
    header = {k: v for k, v in message.items() if k not in KINDS}
    header["byteorder"] = sys.byteorder
    header["columns"] = {}
    for kind in KINDS:
        items = message.get(kind)
        if items:
            cols = items if isinstance(items, dict) else to_columns(kind, items)
            header["columns"][kind] = {k: _spec(v, frames) for k, v in cols.items()}
    frames.insert(0, json.dumps(header, separators=(",", ":")).encode())
    return [sign(key, frames), *frames]


def _value(spec, frames: list[bytes], swap: bool):
    if "a" in spec:
        if spec["a"] not in _TYPECODES:
            raise WireError(f"unknown column type {spec['a']!r}")
        a = array(spec["a"])
        a.frombytes(frames[spec["f"]])
        if swap:
            a.byteswap()
        return a
    if "cat" in spec:
        return Cat(list(spec["cat"]), _value(spec["codes"], frames, swap))
    if "d" in spec:
        return {k: _value(v, frames, swap) for k, v in spec["d"].items()}
    return spec["j"]


def decode(key: bytes, frames: list[bytes], columns: bool = False) -> dict:
    """The message in ``frames``; :class:`WireError` if it is not signed with ``key``.

    ``columns=True`` leaves each kind as columns (see the module docstring).
    """
    if len(frames) < 2:
        raise WireError(f"expected a signature and a header, got {len(frames)} frame(s)")
    signature, rest = frames[0], [bytes(f) for f in frames[1:]]
    if not hmac.compare_digest(signature, sign(key, rest)):
        raise WireError("bad signature: message not from one of this notebook's ranks")
    header = json.loads(rest[0])
    if not isinstance(header, dict) or header.get("v") != VERSION:
        raise WireError(f"not a version-{VERSION} metric message")
    swap = header.pop("byteorder", sys.byteorder) != sys.byteorder
    specs = header.pop("columns", {})
    buffers = rest[1:]
    try:
        for kind in KINDS:
            if kind not in specs:
                header[kind] = {"n": 0} if columns else []
                continue
            cols = {k: _value(v, buffers, swap) for k, v in specs[kind].items()}
            header[kind] = cols if columns else to_rows(kind, cols)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise WireError(f"malformed metric message: {exc!r}") from exc
    return header
