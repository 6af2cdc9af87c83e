"""Replies the controller sent while a notebook outside lost its connection (client side).

A notebook outside the cluster reaches the controller through forwards of its SSH
connection. When that connection is lost, whatever the controller sends meanwhile (a
cell's reply among it) goes into connections that no longer lead anywhere; once the
guard made the connection again, the client's sockets take their routing ids back on
the controller (``launch._handover``) and what comes next reaches them. The replies
sent in between are in ipyparallel's hub, which records every request and its result
(``Client.db_query``): :func:`recover` reads them there and hands each to the client as
if it had come on its socket (ipyparallel's own reply handler: the request's futures,
``outstanding`` and metadata, as for any reply), with what the request printed while
the connection was lost (the hub's record of its output), on the client's IO thread,
where a reply that did arrive meanwhile was handled first.

Example::

    # not run: needs a client of a controller outside
    recover(client)        # after the connection was made again
"""

from __future__ import annotations

import time
from typing import Any

import zmq

_SETTLE = 1.0  # seconds for the client's sockets to connect through the new forwards
_KEYS = [
    "msg_id", "header", "result_header", "result_content", "result_metadata",
    "result_buffers", "stdout", "stderr",
]  # fmt: skip


def recover(client: Any, settle: float = _SETTLE) -> int:
    """Hand ``client`` (an ``ipp.Client``) the replies to its outstanding requests that
    the hub has and it has not; how many the hub had."""
    time.sleep(settle)
    ids = sorted(client.outstanding)
    if not ids:
        return 0
    records = client.db_query(
        {"msg_id": {"$in": ids}, "completed": {"$ne": None}}, keys=_KEYS
    )  # fmt: skip
    for record in records:
        client._io_loop.add_callback(_deliver, client, record)
    return len(records)


def _deliver(client: Any, record: dict) -> None:
    """On the client's IO thread: ``record``'s reply, unless it came by itself."""
    if record["msg_id"] not in client.outstanding:
        return
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
    client._dispatch_reply([zmq.Frame(p) for p in parts])  # as its socket gives them
    md = client.metadata[record["msg_id"]]
    for stream in ("stdout", "stderr"):  # what it printed while the connection was lost
        had, whole = md.get(stream) or "", record.get(stream) or ""
        if len(whole) > len(had) and whole.startswith(had):
            md[stream] = whole
    # its last output (the kernel's "idle") went the same way: none is coming
    output = client._output_futures.get(record["msg_id"])
    if output is not None and not output.done():
        output.set_result(None)
