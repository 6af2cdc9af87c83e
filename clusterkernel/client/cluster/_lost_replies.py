"""Replies and output the controller sent while a notebook outside lost its connection (client side).

A notebook outside the cluster reaches the controller through forwards of its SSH
connection. When that connection is lost, whatever the controller sends meanwhile (a
cell's reply, what the ranks print) goes into connections that no longer lead anywhere;
once the guard made the connection again, the client's sockets take their routing ids
back on the controller (``launch._handover``) and what comes next reaches them. What was
sent in between is in ipyparallel's hub, which records every request, its reply, and
its stdout and stderr as the engines write them (``Client.db_query``).

- :func:`hold`, as soon as the loss is known: the client's live output waits from then
  on, unseen, so that nothing a rank prints after the gap reaches the cell's renderer
  (which only ever appends) before what it printed in the gap;
- :func:`recover`, once the connection is back: each request outstanding at the loss gets,
  from its record, what it printed in the gap and, if it ended meanwhile, its reply;
  then the held output goes on, in order. A running cell shows the missed lines where
  they belong, once, as if they had come live.

Example::

    # not run: needs a client of a controller outside
    back = hold(client)    # the connection is lost
    back()                 # it was made again: recover(client, held)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import zmq

_SETTLE = 1.0  # seconds for the client's sockets to connect through the new forwards
_STREAMS = ("stdout", "stderr")
_KEYS = [
    "msg_id", "header", "completed", "result_header", "result_content", "result_metadata",
    "result_buffers", *_STREAMS,
]  # fmt: skip


class Held:
    """The client's live output (iopub) held since its connection was lost, and the
    requests outstanding then; touched on the client's IO thread only."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.ids: list[str] = []
        self._frames: list[list[zmq.Frame]] = []

    def start(self) -> None:
        stream = self.client._iopub_stream
        if stream.closed():
            return
        # a reply that came just before the loss may have lost its last output
        waiting = (m for m, f in self.client._output_futures.items() if not f.done())
        self.ids = sorted({*self.client.outstanding, *waiting})
        stream.on_recv(self._frames.append, copy=False)

    def release(self) -> list[list[zmq.Frame]]:
        """What was held (what reached the socket by now too), in order; the client's
        own handler takes the next."""
        stream = self.client._iopub_stream
        if not stream.closed():
            stream.flush(zmq.POLLIN)
            stream.on_recv(self.client._dispatch_iopub, copy=False)
        frames, self._frames = self._frames, []
        return frames


def hold(client: Any) -> Callable[[], int]:
    """Hold ``client``'s live output from now on (its connection was lost); the function
    to call once the connection is back (:func:`recover` of this hold)."""
    held = Held(client)
    client._io_loop.add_callback(held.start)
    return functools.partial(recover, client, held)


def recover(client: Any, held: Held, settle: float = _SETTLE) -> int:
    """Give ``client`` (an ``ipp.Client``) what the hub has of the requests ``held`` names
    (those outstanding, or with output to come, at the loss) and the client missed: the
    replies it has not had, and the output printed while the connection was lost; then
    its ``held`` output. How many records the hub had.

    Each request's stdout and stderr become the client's text, then the record's beyond
    it up to where the held text begins (the hub, beside the engines, is at least as far:
    the held text's last place in the record; the record's end where it is not that far
    yet); a record that does not begin with the client's text (a line rewritten by a
    carriage return) adds nothing: a gap is left, never a line shown twice.

    Private parts of ipyparallel's client, as few as this needs: ``_io_loop`` (all of it
    runs on the client's IO thread, where its handlers run, so nothing comes in between),
    ``_iopub_stream`` (live output enters there: held, then given back),
    ``_dispatch_iopub`` and ``_dispatch_reply`` (its own handlers, for held output and
    recovered replies: futures, ``outstanding`` and metadata as for any message) and
    ``_output_futures`` (a request that ended in the gap lost its last output, the
    kernel's "idle", too: none is coming)."""
    records: list[dict] = []
    try:
        time.sleep(settle)
        if held.ids:
            records = client.db_query({"msg_id": {"$in": held.ids}}, keys=_KEYS)
    finally:  # the held output goes on even where the hub could not be read
        client._io_loop.add_callback(_deliver, client, held, records)
    return len(records)


def _deliver(client: Any, held: Held, records: list[dict]) -> None:
    """On the client's IO thread: the records' replies and output, then the held output."""
    frames = held.release()
    live = _texts(client, frames)
    for record in records:
        msg_id = record["msg_id"]
        if record.get("completed") and msg_id in client.outstanding:
            _reply(client, record)
        md = client.metadata.get(msg_id)
        if md is None:  # its futures are done: no one reads its output any more
            continue
        for stream in _STREAMS:
            had = md.get(stream) or ""
            md[stream] = _before(had, record.get(stream) or "", live.get((msg_id, stream), ""))
    for parts in frames:
        client._dispatch_iopub(parts)
    for record in records:  # one that ended in the gap: its "idle" was lost with it
        output = client._output_futures.get(record["msg_id"]) if record.get("completed") else None
        if output is not None and not output.done():
            output.set_result(None)


def _reply(client: Any, record: dict) -> None:
    """``record``'s reply, handed to the client as its socket gives one."""
    content = record["result_content"]
    if isinstance(content, str | bytes):  # as the hub's database kept it
        content = client.session.unpack(content)
    reply = {
        "header": record["result_header"],
        "parent_header": record["header"],
        "metadata": record["result_metadata"] or {},
        "content": content,
    }
    parts = [*client.session.serialize(reply), *(record.get("result_buffers") or [])]
    client._dispatch_reply([zmq.Frame(p) for p in parts])


def _texts(client: Any, frames: list[list[zmq.Frame]]) -> dict[tuple[str, str], str]:
    """``{(request, stream): text}`` of the held stream messages of this client."""
    session = client.session
    texts: dict[tuple[str, str], str] = {}
    for parts in frames:
        _, msg = session.feed_identities(parts, copy=False)
        try:  # without its content: a peek, which leaves the signature to the handler
            msg = session.deserialize(msg, content=False, copy=False)
        except (ValueError, TypeError):  # the client's handler says what is wrong
            continue
        parent = msg["parent_header"]
        if msg["msg_type"] != "stream" or parent.get("session") != session.session:
            continue
        content = session.unpack(msg["content"])
        key = (parent["msg_id"], content["name"])
        texts[key] = texts.get(key, "") + content["text"]
    return texts


def _before(had: str, whole: str, live: str) -> str:
    """A stream's text before its held text ``live``: ``had`` (the client's) and the
    record ``whole``'s after it (see :func:`recover`)."""
    if not whole.startswith(had):
        return had
    if live:
        at = whole.rfind(live, len(had))
        if at >= 0:
            return whole[:at]
        for k in range(min(len(live), len(whole) - len(had)), 0, -1):
            if whole.endswith(live[:k]):  # the record has only the held text's start
                return whole[: len(whole) - k]
    return whole
