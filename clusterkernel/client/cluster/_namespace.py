"""Tab and Shift-Tab on the ranks' names (client side), without ever waiting long.

:func:`complete` and :func:`inspect` ask one rank's engine kernel through its control
channel, which its control thread answers even while the rank's main thread runs a
long cell or waits in MPI; the answer is that kernel's own ``complete_reply`` /
``inspect_reply`` (IPython's completer and inspector on the rank's namespace). A rank
that does not answer within ``timeout`` (a C call holding the GIL, a dead rank) is
served from the top-level names it listed last: those come with every answer and,
for a rank completion has asked once, after every cell (:meth:`RankNames.refresh`,
which does not wait for its reply). Both are ``Cluster``'s methods of those names.

Example::

    cluster.complete("torch.zer", 9)["matches"]          # ['zeros', 'zeros_like']
    cluster.inspect("model", 5)["data"]["text/plain"]    # rank 0's model, as model? shows it
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

from clusterkernel.client.cluster._ipp import control_request, control_send
from clusterkernel.protocol._names import COMPLETE_REQUEST, INSPECT_REQUEST

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

# what a rank's completer is first asked (see RankNames.warm): an attribute of a builtin,
# so jedi loads what every later completion needs, and nothing of the user's is touched
_WARM_CODE = "str.jo"
_NAME_BEFORE_CURSOR = re.compile(r"(?<![\w.])[A-Za-z_]\w*$")


class RankNames:
    """The top-level names each rank listed last: completion's answer when a rank is busy."""

    def __init__(self) -> None:
        self._names: dict[int, list[str]] = {}
        self._lock = threading.Lock()  # written from the client's IO thread too

    def remember(self, rank: int, names: list[str] | None) -> None:
        if names is not None:
            with self._lock:
                self._names[rank] = list(names)

    def starting_with(self, rank: int, prefix: str) -> list[str]:
        with self._lock:
            return [n for n in self._names.get(rank, ()) if n.startswith(prefix)]

    def __contains__(self, rank: int) -> bool:
        with self._lock:
            return rank in self._names

    def warm(self, cluster: Cluster, rank: int = 0) -> None:
        """Have ``rank``'s completer answer once now, and list its names from now on
        (:meth:`refresh` after every cell), without waiting for the reply.

        A rank's first completion loads jedi and the builtins' stubs (seconds beside
        a busy cell): asked by the first Tab, that outlasts the Tab's
        timeout, and with no names listed yet the Tab answered nothing.
        """
        self.remember(rank, [])
        try:
            engine = cluster.engine_id(rank)
            content = {"code": _WARM_CODE, "cursor_pos": len(_WARM_CODE)}
            future = control_send(cluster.client, engine, COMPLETE_REQUEST, content)
        except Exception:  # the rank or the client is gone: the next start warms again
            return
        future.add_done_callback(lambda f: self._store(rank, f))

    def forget(self) -> None:
        """After a restart the ranks' names are gone."""
        with self._lock:
            self._names.clear()

    def refresh(self, cluster: Cluster) -> None:
        """Ask the ranks completion has asked before for their names again; each reply
        is stored when it comes (nothing waits for it)."""
        with self._lock:
            ranks = list(self._names)
        for rank in ranks:
            try:
                engine = cluster.engine_id(rank)
                future = control_send(
                    cluster.client, engine, COMPLETE_REQUEST, {"names_only": True}
                )
            except Exception:  # the rank or the client is gone: the next answer re-lists
                continue
            future.add_done_callback(lambda f, rank=rank: self._store(rank, f))

    def _store(self, rank: int, future) -> None:
        try:
            content = future.result().get("content", {})
        except Exception:  # the rank went away: nothing to store
            return
        self.remember(rank, content.get("names"))


def _ask(cluster: Cluster, rank: int, msg_type: str, content: dict, timeout: float) -> dict | None:
    replies = control_request(
        cluster.client, {rank: cluster.engine_id(rank)}, msg_type, content, timeout
    )
    answer = replies.get(rank)
    if answer is None or answer.get("status") != "ok":
        return None
    return answer


def complete(
    cluster: Cluster, code: str, cursor_pos: int | None = None, rank: int = 0, timeout: float = 1.0
) -> dict:
    """What Tab offers at ``cursor_pos`` (default: the end) in ``code`` on rank ``rank``:
    a Jupyter ``complete_reply`` content (``matches``, ``cursor_start``, ``cursor_end``).

    The rank's own IPython completer answers, through its control channel, so a rank
    busy in a cell answers too; one that does not within ``timeout`` seconds gets the
    top-level names it listed last (``metadata["clusterkernel"]["from"] == "cache"``).
    Nothing in ``code`` is run.

    Example::

        cluster.run("import torch")
        cluster.complete("torch.zer")["matches"]    # ['zero_', 'zeros', 'zeros_like']
    """
    cluster.require_running()
    cluster.engine_id(rank)  # clear error for a rank that does not exist
    cursor_pos = len(code) if cursor_pos is None else cursor_pos
    names = cluster.rank_names
    answer = _ask(
        cluster, rank, COMPLETE_REQUEST, {"code": code, "cursor_pos": cursor_pos}, timeout
    )
    if answer is not None:
        names.remember(rank, answer.get("names"))
        reply = dict(answer["reply"])
        reply.setdefault("metadata", {})["clusterkernel"] = {"rank": rank, "from": "rank"}
        return reply
    token = _NAME_BEFORE_CURSOR.search(code[:cursor_pos])
    prefix = token.group() if token else ""
    matches = names.starting_with(rank, prefix) if token else []
    return {
        "status": "ok",
        "matches": matches,
        "cursor_start": cursor_pos - len(prefix),
        "cursor_end": cursor_pos,
        "metadata": {"clusterkernel": {"rank": rank, "from": "cache"}},
    }


def inspect(
    cluster: Cluster,
    code: str,
    cursor_pos: int | None = None,
    detail_level: int = 0,
    rank: int = 0,
    timeout: float = 1.0,
) -> dict:
    """What Shift-Tab / ``name?`` (``detail_level=1``: ``name??``) shows for the name at
    ``cursor_pos`` in ``code`` on rank ``rank``: a Jupyter ``inspect_reply`` content
    (``found``, ``data``). ``found`` is False when the rank does not answer in time.

    Example::

        cluster.inspect("model")["data"]["text/plain"]   # rank 0's model, as model? shows it
    """
    cluster.require_running()
    cluster.engine_id(rank)
    cursor_pos = len(code) if cursor_pos is None else cursor_pos
    content = {"code": code, "cursor_pos": cursor_pos, "detail_level": detail_level}
    answer = _ask(cluster, rank, INSPECT_REQUEST, content, timeout)
    if answer is None:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}
    return answer["reply"]
