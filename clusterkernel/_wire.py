"""The metric stream's wire format, known to both sides (standard library only).

One message is two ZMQ frames: an HMAC-SHA256 of the payload under a key that the
notebook hands each rank at setup, then the payload, UTF-8 JSON. The receiver
checks the signature before parsing, so anything else that connects to its port
(the port is on loopback, but any local user can reach it) is refused unread.
JSON rather than pickle: the notebook never unpickles what arrives here.

A payload::

    {"v": 1, "rank": 0, "seq": 7, "pc": <perf_counter>, "wall": <time.time>,
     "lost": {"comm": 0, "scalar": 0, "span": 0},
     "comm": [[op, nbytes, algorithm, group_size, start, duration, wait], ...],
     "scalar": [[step, time, {"loss": 0.4}], ...],
     "span": [[name, start, duration], ...],
     "proc": {"host": "a", "pid": 123, "cpu": 97.0, "rss_mib": 310.2}}

``pc``/``wall`` are read together on the rank, so ``wall - pc`` turns that
rank's ``perf_counter`` times into wall-clock times for a common timeline.
"""

from __future__ import annotations

import hashlib
import hmac
import json

VERSION = 1


class WireError(ValueError):
    """A message that is not signed with our key, or not ours at all."""


def sign(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def encode(key: bytes, message: dict) -> list[bytes]:
    """``[signature, payload]`` frames for one message."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return [sign(key, payload), payload]


def decode(key: bytes, frames: list[bytes]) -> dict:
    """The message in ``frames``; :class:`WireError` if it is not signed with ``key``."""
    if len(frames) != 2:
        raise WireError(f"expected 2 frames (signature, payload), got {len(frames)}")
    signature, payload = frames
    if not hmac.compare_digest(signature, sign(key, payload)):
        raise WireError("bad signature: message not from one of this notebook's ranks")
    message = json.loads(payload)
    if not isinstance(message, dict) or message.get("v") != VERSION:
        raise WireError(f"not a version-{VERSION} metric message")
    return message
