"""Every use of ipyparallel's private API, in one place (client side).

An ipyparallel upgrade that moves these breaks this module alone:

- **control requests** (:func:`control_request`): a message of our own on an
  engine's control channel (stacks, debugger, torch abort), which ipykernel's
  control thread answers while the rank's main thread is blocked in MPI. The
  client has no public call to address one engine's control channel;
- **pages** (:func:`pager_outputs`): what ``obj?`` or ``%pdoc`` in a cell shows travels
  in the engine's execute reply as a "page" payload, which ipyparallel keeps in its
  reply object's private content;
- **engine identities** (:func:`engine_identities`): the registration identity behind each
  engine id; a process registered under a dead engine's id has a new one, which tells the
  death even where the controller's word of it came late (after the new registration);
- **reply timestamps** (:func:`install_date_parser`): every reply to a cell carries
  the time its engine started the cell, and ipyparallel's client parses it with
  ``dateutil.parser.parse`` in its IO thread, a cost per rank and cell that grows
  with the ranks (BENCHMARKS.md, "Scale").
  ``datetime.fromisoformat`` reads the same string to the same value, far faster;
  anything it cannot read still goes to ipyparallel's own parser. Installed when a cluster starts, not at import, so a
  process that only imports clusterkernel keeps ipyparallel as it is.

Example::

    from clusterkernel.client.cluster import _ipp
    _ipp.install_date_parser()    # once; a second call does nothing
    _ipp.control_request(client, {0: 0, 1: 1}, STACK_REQUEST, {}, 3.0)  # protocol._names
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from ipyparallel import util as _util

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

_ORIGINAL = _util._parse_date


def parse_date(s):
    """``ipyparallel.util._parse_date`` with the standard library's ISO 8601 reader."""
    if isinstance(s, str) and _util.ISO8601_PAT.match(s):
        try:
            dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith("Z") else s)
        except ValueError:  # Python 3.10 reads only isoformat()'s own output
            return _ORIGINAL(s)
        return _util._ensure_tzinfo(dt)
    return _ORIGINAL(s)


def install_date_parser() -> None:
    """Make ipyparallel's client use :func:`parse_date` (unless something else replaced it)."""
    if _util._parse_date is _ORIGINAL:
        _util._parse_date = parse_date


def control_send(client, engine_id: int, msg_type: str, content: dict):
    """Send ``msg_type`` on one engine's control channel; the future of its reply message
    (it does not wait: sending happens in the client's IO thread)."""
    ident = client._build_targets([engine_id])[0]
    return client._send(client._control_stream, msg_type, content=content, ident=ident)


def control_request(
    client, engines: dict[int, int], msg_type: str, content: dict, timeout: float = 3.0
) -> dict[int, dict]:
    """Send ``msg_type`` on each engine's control channel (``engines``: rank -> engine id);
    ``{rank: reply content}`` of those that answered within ``timeout``."""
    if not engines:
        return {}
    futures = {rank: control_send(client, eid, msg_type, content) for rank, eid in engines.items()}
    deadline = time.monotonic() + timeout
    out = {}
    for rank, future in futures.items():
        try:
            msg = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # no answer in time (or the engine is gone)
            continue
        out[rank] = msg.get("content", {})
    return out


def asker(cluster: Cluster, msg_type: str) -> Callable[[list[int], dict, float], dict[int, dict]]:
    """``ask(ranks, content, timeout)``: :func:`control_request` of ``msg_type`` to those of
    ``cluster``'s ranks (the engines they have when asked). What the debugger is given
    (``client.debug.Ask``), so that it sends to ranks without importing this package."""

    def ask(ranks: list[int], content: dict, timeout: float) -> dict[int, dict]:
        engines = {rank: cluster.engine_id(rank) for rank in ranks}
        return control_request(cluster.client, engines, msg_type, content, timeout)

    return ask


def pager_outputs(result) -> list[dict]:
    """The pages an engine's execute reply carries (``obj?``, ``obj??``, ``%pdoc`` in the
    cell), as display_data contents; [] for anything else (an error, a lost engine)."""
    content = getattr(result, "_content", None)
    if not isinstance(content, dict):
        return []
    return [
        {"data": page["data"], "metadata": {}}
        for page in content.get("payload") or ()
        if page.get("source") == "page" and isinstance(page.get("data"), dict)
    ]


def engine_identities(client) -> dict[int, str]:
    """Each registered engine id's registration identity (``{id: uuid}``); the client's IO
    thread updates them, so a copy made while it does is taken again."""
    for _ in range(10):
        try:
            return dict(client._engines)
        except RuntimeError:  # changed size during the copy
            time.sleep(0.001)
    return dict(client._engines)
