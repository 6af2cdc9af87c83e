"""The metric stream's wire format, known to both sides (standard library only).

One message is a list of ZMQ frames: an HMAC-SHA256 signature, a JSON header, then
raw column buffers (int64 / float64 arrays) that the header describes. The
signature covers every frame, with its length, under a key the notebook hands each
rank at setup; the receiver checks it before parsing anything, so whatever else
connects to its port (loopback, but any local user can reach it) is refused
unread. Nothing is ever unpickled: the header is JSON and the columns are plain
numbers.

Why columns and not JSON all the way: a rank that logs in a tight loop makes
records faster than ``json.dumps`` can print floats (~3 us per record, measured
in benchmarks/bench_dashboard.py), and the stream's thread would then take the
GIL from the training loop. Packing a batch into arrays is done in C by
``zip``/``array`` and costs a small fraction of that.

:func:`encode` takes and :func:`decode` returns the same message dict::

    {"v": 1, "rank": 0, "seq": 7, "pc": <perf_counter>, "wall": <time.time>,
     "lost": {"comm": 0, "scalar": 0, "span": 0},
     "comm": [(op, nbytes, algorithm, group_size, start, duration, wait), ...],
     "scalar": [(step, time, {"loss": 0.4}), ...],
     "span": [(name, start, duration), ...],
     "proc": {"host": "a", "pid": 123, "cpu": 97.0, "rss_mib": 310.2}}

``pc``/``wall`` are read together on the rank, so ``wall - pc`` turns that
rank's ``perf_counter`` times into wall-clock times for a common timeline.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from array import array
from operator import itemgetter

VERSION = 1
KINDS = ("comm", "scalar", "span")


class WireError(ValueError):
    """A message that is not signed with our key, or not ours at all."""


def sign(key: bytes, frames: list[bytes]) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        mac.update(len(frame).to_bytes(8, "little"))
        mac.update(frame)
    return mac.digest()


class _Buffers:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def add(self, typecode: str, values) -> int:
        self.frames.append(array(typecode, values).tobytes())
        return len(self.frames) - 1


def _ints(bufs: _Buffers, values: tuple) -> dict:
    try:
        return {"q": bufs.add("q", values)}
    except (TypeError, OverflowError):  # a float or huge step: rare, keep it exact
        return {"json": list(values)}


def _pack_scalar(bufs: _Buffers, items: list[tuple]) -> dict:
    steps, times, values = zip(*items)
    spec = {"n": len(items), "step": _ints(bufs, steps), "time": bufs.add("d", times)}
    names = list(values[0])
    if all(v.keys() == values[0].keys() for v in values):
        spec["names"] = names
        spec["values"] = [bufs.add("d", map(itemgetter(n), values)) for n in names]
    else:
        spec["dicts"] = list(values)
    return spec


def _pack_comm(bufs: _Buffers, items: list[tuple]) -> dict:
    op, nbytes, alg, gsize, start, dur, wait = zip(*items)
    return {
        "n": len(items),
        "op": list(op),
        "alg": list(alg),
        "nbytes": _ints(bufs, nbytes),
        "group_size": _ints(bufs, gsize),
        "start": bufs.add("d", start),
        "duration": bufs.add("d", dur),
        "wait": bufs.add("d", wait),
    }


def _pack_span(bufs: _Buffers, items: list[tuple]) -> dict:
    name, start, dur = zip(*items)
    return {
        "n": len(items),
        "name": list(name),
        "start": bufs.add("d", start),
        "duration": bufs.add("d", dur),
    }


_PACK = {"comm": _pack_comm, "scalar": _pack_scalar, "span": _pack_span}


def encode(key: bytes, message: dict) -> list[bytes]:
    """``[signature, header, *columns]`` frames for one message."""
    bufs = _Buffers()
    header = {k: v for k, v in message.items() if k not in KINDS}
    header["byteorder"] = sys.byteorder
    header["columns"] = {k: _PACK[k](bufs, message[k]) for k in KINDS if message.get(k)}
    frames = [json.dumps(header, separators=(",", ":")).encode(), *bufs.frames]
    return [sign(key, frames), *frames]


def _column(spec, frames: list[bytes], swap: bool, typecode: str = "d") -> list:
    if isinstance(spec, dict):
        if "json" in spec:
            return list(spec["json"])
        spec = spec["q"]
        typecode = "q"
    a = array(typecode)
    a.frombytes(frames[spec])
    if swap:
        a.byteswap()
    return a.tolist()


def _unpack(kind: str, spec: dict, frames: list[bytes], swap: bool) -> list[tuple]:
    def col(name: str) -> list:
        return _column(spec[name], frames, swap)

    if kind == "scalar":
        if "dicts" in spec:
            values = spec["dicts"]
        else:
            cols = [_column(i, frames, swap) for i in spec["values"]]
            names = spec["names"]
            values = [dict(zip(names, row)) for row in zip(*cols)]
        return list(zip(col("step"), col("time"), values))
    if kind == "comm":
        return list(
            zip(
                spec["op"],
                col("nbytes"),
                spec["alg"],
                col("group_size"),
                col("start"),
                col("duration"),
                col("wait"),
            )
        )
    return list(zip(spec["name"], col("start"), col("duration")))


def decode(key: bytes, frames: list[bytes]) -> dict:
    """The message in ``frames``; :class:`WireError` if it is not signed with ``key``."""
    if len(frames) < 2:
        raise WireError(f"expected a signature and a header, got {len(frames)} frame(s)")
    signature, rest = frames[0], [bytes(f) for f in frames[1:]]
    if not hmac.compare_digest(signature, sign(key, rest)):
        raise WireError("bad signature: message not from one of this notebook's ranks")
    header = json.loads(rest[0])
    if not isinstance(header, dict) or header.get("v") != VERSION:
        raise WireError(f"not a version-{VERSION} metric message")
    swap = header.pop("byteorder", sys.byteorder) != sys.byteorder
    columns = header.pop("columns", {})
    buffers = rest[1:]
    for kind in KINDS:
        header[kind] = _unpack(kind, columns[kind], buffers, swap) if kind in columns else []
    return header
