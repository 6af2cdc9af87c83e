"""Debug ranks from the notebook or a script: post-mortem and breakpoints (client side).

:meth:`Cluster.debug <clusterkernel.Cluster.debug>` opens a :class:`DebugSession` on
some ranks; :meth:`DebugSession.send` sends one pdb command to each of them and
returns the answers by rank. A rank is debugged where it is:

- stopped at ``breakpoint()`` in a running cell: the command runs in that pdb
  (``c`` lets the rank run on; ``q`` ends its cell with ``BdbQuit``);
- otherwise, post-mortem on the traceback of its last failed cell (``where``,
  ``up``/``down``, ``p``, ``pp``, ``list``, ``args``, ``locals``).

Commands travel on ipyparallel's signed control channel and are answered by each
engine's control thread (:mod:`clusterkernel.rank._debugger`), so ranks on other hosts
work, and a rank answers while its cell runs. The cluster gives a session what it needs
(itself, as :class:`Debugged`, and an :data:`Ask` that sends a request to its ranks):
this package never imports the cluster's, which imports it.

Example::

    try:
        cluster.run("x = comm.rank() * 10\\nif comm.rank() in (1, 3): 1 / 0")
    except RankError:
        pass
    with cluster.debug(ranks=[1, 3]) as dbg:
        dbg.send("p x")              # {1: "10", 3: "30"}
        print(dbg.send("where"))     # answers labelled [rank 1] / [ranks 1,3]
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Protocol

from clusterkernel.client.errors import ClusterError, format_ranks, rank_label

__all__ = ["DebugSession", "Answers", "Ask", "Debugged"]

Ask = Callable[[list[int], dict, float], dict[int, dict]]
"""``ask(ranks, content, timeout)``: send the debugger request ``content`` to each of
``ranks`` (its engine's control channel, :data:`clusterkernel.protocol._names.DEBUG_REQUEST`);
``{rank: reply content}`` of those that answered within ``timeout``. The cluster makes it
(``Cluster.debug``, the cell runner's breakpoint stops)."""


class Debugged(Protocol):
    """What a debug session reads of its cluster (a :class:`~clusterkernel.Cluster` is one).

    Example::

        DebugSession(cluster, [1], ask=ask)   # what cluster.debug([1]) does
    """

    @property
    def running(self) -> bool: ...
    @property
    def live_ranks(self) -> list[int]: ...
    def engine_id(self, rank: int) -> int: ...


def control_request(ask: Ask, ranks: list[int], content: dict, timeout: float) -> dict[int, dict]:
    """:data:`Ask` ``ranks``; ``{rank: reply content}``, where a rank that does not answer
    within ``timeout`` gets ``{"status": "timeout"}``."""
    replies = ask(ranks, content, timeout)
    return {rank: replies.get(rank, {"status": "timeout"}) for rank in ranks}


class Answers(dict):
    """``{rank: text}``; printed, identical answers show once under their ranks.

    Example::

        print(Answers({1: "10", 3: "10", 2: "0"}))
        # [ranks 1,3] 10
        # [rank 2] 0
    """

    def __str__(self) -> str:
        by_text: dict[str, list[int]] = {}
        for rank in sorted(self):
            by_text.setdefault(self[rank], []).append(rank)
        parts = []
        for text, ranks in by_text.items():
            label = f"[{rank_label(ranks)}]"
            body = text.rstrip("\n")
            parts.append(f"{label}\n{body}" if "\n" in body else f"{label} {body}".rstrip())
        return "\n".join(parts)


class DebugSession:
    """pdb on several ranks at once: :meth:`send` one command, get each rank's answer.

    Made by :meth:`Cluster.debug <clusterkernel.Cluster.debug>`. ``state`` says, per
    rank, what is debugged there: ``"breakpoint"`` (stopped at ``breakpoint()``),
    ``"post-mortem"`` (its last traceback), ``"running"`` (it was at a breakpoint
    and runs on) or ``None`` (nothing to debug; its answers say so). ``errors`` has
    each failed rank's error line. ``state=`` given skips asking the ranks (the cell
    runner knows a rank is at its breakpoint). ``ask`` sends the requests to the ranks
    (:data:`Ask`; the cluster gives it).

    Example::

        dbg = cluster.debug(ranks=[1])
        dbg.send("p x")        # {1: "10"}
        dbg.send("c")          # a rank at a breakpoint runs on
        dbg.close()
    """

    def __init__(
        self,
        cluster: Debugged,
        ranks: list[int] | None = None,
        timeout: float = 10.0,
        state: dict[int, str | None] | None = None,
        *,
        ask: Ask,
    ) -> None:
        self.cluster = cluster
        self.ask = ask
        self.timeout = timeout
        self.id = uuid.uuid4().hex[:12]
        self._closed = False
        self.errors: dict[int, str] = {}  # rank -> its last error, "ValueError: bad 11"
        for r in ranks or ():
            cluster.engine_id(r)  # clear error for a rank that does not exist
        if state is None:  # ask every rank: the answers name the others that have one
            infos = self._ask({"op": "info"}, cluster.live_ranks)
            self.errors = {r: i["error"] for r, i in infos.items() if i.get("error")}
            state = {r: "breakpoint" if i.get("paused") else None for r, i in infos.items()}
            state.update({r: "post-mortem" for r in self.errors if not state.get(r)})
        self._paused = sorted(r for r, kind in state.items() if kind == "breakpoint")
        self._failed = sorted(r for r, kind in state.items() if kind == "post-mortem")
        if ranks is None:
            ranks = self._paused or self._failed
            if not ranks:
                raise ClusterError(
                    "No rank is stopped at breakpoint() or has a failed cell to debug."
                )
        self.ranks = sorted(set(ranks))
        self.state: dict[int, str | None] = {r: state.get(r) for r in self.ranks}

    def __repr__(self) -> str:
        return f"<DebugSession {rank_label(self.ranks)} {self.state}>"

    def __enter__(self) -> DebugSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ask(self, content: dict, ranks: list[int], wait: float = 3.0) -> dict[int, dict]:
        return control_request(self.ask, ranks, content, wait)

    def send(self, command: str) -> Answers:
        """Run one pdb command on every rank of the session; ``{rank: output}``.

        A rank with nothing to debug answers why (and which ranks have something);
        a command that keeps running (``n`` over a long call) answers that the rank
        runs, and its output comes with the rank's next stop.
        """
        if self._closed:
            raise ClusterError("This debug session is closed; open another with cluster.debug().")
        if "\n" in command:
            raise ValueError("send() takes one pdb command (one line) at a time.")
        answers = Answers()
        live: dict[str, list[int]] = {}
        for r in self.ranks:
            kind = self.state[r]
            if kind in ("breakpoint", "post-mortem"):
                live.setdefault(kind, []).append(r)
            else:
                answers[r] = self._nothing_here(r)
        for kind, ranks in live.items():
            content = {
                "op": "command",
                "session": self.id,
                "kind": kind,
                "command": command,
                "timeout": self.timeout,
            }
            replies = self._ask(content, ranks, wait=self.timeout + 5)
            for r, reply in replies.items():
                answers[r] = self._answer(r, reply)
        return Answers(sorted(answers.items()))

    def _answer(self, rank: int, reply: dict) -> str:
        status = reply.get("status")
        if status == "timeout":
            return f"(rank {rank} did not answer within {self.timeout + 5:g} s)"
        if status != "ok":
            return f"(debugger error on rank {rank}: {reply.get('error')})"
        if reply.get("error") == "no_traceback":
            self.state[rank] = None
            return self._nothing_here(rank)
        output = reply.get("output", "")
        if reply.get("kind") == "breakpoint" and not reply.get("paused"):
            self.state[rank] = "running"
            if reply.get("error") == "running":
                return f"(rank {rank} is not stopped at a breakpoint: it runs)"
            if reply.get("note") == "running":
                output += f"(rank {rank} runs: no prompt within {self.timeout:g} s)"
        return output.rstrip("\n")

    def _nothing_here(self, rank: int) -> str:
        if self.state.get(rank) == "running":
            return f"(rank {rank} is no longer stopped at a breakpoint: it runs)"
        others = []
        if self._paused:
            others.append(f"stopped at breakpoint(): {format_ranks(self._paused)}")
        if self._failed:
            others.append(f"with a traceback: {format_ranks(self._failed)}")
        where = f"Ranks {'; '.join(others)}." if others else "No rank has either."
        return (
            f"(rank {rank} has no traceback to debug and is not stopped at breakpoint(). {where})"
        )

    def release(self) -> list[int]:
        """End the pdb of every session rank stopped at a breakpoint (its cell raises
        ``BdbQuit``); the ranks released."""
        replies = self._ask({"op": "release"}, self.ranks)
        return [r for r, reply in replies.items() if reply.get("released")]

    def close(self) -> None:
        """Forget the post-mortem debuggers of this session on the ranks.

        Ranks stopped at a breakpoint stay stopped: ``send("c")`` lets them run on.
        """
        if self._closed:
            return
        self._closed = True
        pm = [r for r, kind in self.state.items() if kind == "post-mortem"]
        if pm and self.cluster.running:
            self._ask({"op": "close", "session": self.id}, pm)
