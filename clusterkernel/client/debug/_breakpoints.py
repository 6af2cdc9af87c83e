"""Ranks stopped at ``breakpoint()`` while a cell runs, and a prompt for each (client side).

The engine announces each stop on IOPub (``publish_data``, see
:mod:`clusterkernel.rank._debugger`); ipyparallel files it in the cell's metadata, which
the cell runner reads anyway, so noticing a stop costs one dict lookup per rank
and poll. For a stop, :class:`Stops` asks for pdb commands with ``input()``
(``(Pdb rank 1) ``; a text box in the notebook), sends each to the rank and shows
the answer, until ``c`` lets the rank run on. Where there is no input (a front end
that does not send it, a script, a test) it says how to debug the rank instead
(``--noblock`` with ``%mpi debug`` / ``cluster.debug``) and lets the rank run on,
so a cell never hangs at a prompt nobody can see.

Example (inside :class:`~clusterkernel.client.cluster.runner.CellRun`)::

    stops = Stops(cluster, ranks, metadata, renderer, ask)   # ask: the cluster's (debug.Ask)
    spent = stops.check()     # prompts for new stops; seconds spent at the prompt
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from clusterkernel.client.debug import Answers, Ask, Debugged, DebugSession, control_request
from clusterkernel.protocol._names import PAUSE_KEY

if TYPE_CHECKING:
    from clusterkernel.client.output import Renderer


class Stops:
    """Breakpoint stops of one running cell: notice them, prompt, release them."""

    def __init__(
        self, cluster: Debugged, ranks: list[int], mds: list[dict], renderer: Renderer, ask: Ask
    ):
        self.cluster = cluster
        self.ask = ask  # the cluster's: requests to its ranks' debuggers
        self.ranks = ranks
        self.mds = mds
        self.renderer = renderer
        self._seen: dict[int, int] = {}  # rank -> last stop handled
        self._no_input = False  # told once; later stops just run on

    def _new(self) -> list[tuple[int, dict]]:
        out = []
        for rank, md in zip(self.ranks, self.mds):
            stop = (md.get("data") or {}).get(PAUSE_KEY)
            if stop and stop["seq"] > self._seen.get(rank, 0):
                out.append((rank, stop))
        return out

    def check(self) -> float:
        """Prompt for every new stop; return the seconds spent at prompts."""
        new = self._new()
        if not new:
            return 0.0
        started = time.monotonic()
        for rank, stop in new:
            info = control_request(self.ask, [rank], {"op": "info"}, 3.0)[rank]
            if info.get("seq", 0) > stop["seq"]:
                continue  # stopped again since: that stop's notice is on its way
            self._seen[rank] = stop["seq"]
            if info.get("paused"):  # else continued already (%mpi debug, cluster.debug)
                self._prompt(rank, stop["text"])
        return time.monotonic() - started

    def _show(self, rank: int, text: str) -> None:
        if text.strip():
            self.renderer.notice(str(Answers({rank: text})))

    def _prompt(self, rank: int, where: str) -> None:
        session = DebugSession(self.cluster, state={rank: "breakpoint"}, ask=self.ask)
        if self._no_input:
            self._run_on(session, rank)
            return
        self._show(rank, f"stopped at breakpoint():\n{where}")
        while session.state[rank] == "breakpoint":
            try:
                line = input(f"(Pdb rank {rank}) ")
            except EOFError:
                line = "c"
            except (NotImplementedError, OSError):  # IPython's StdinNotImplementedError
                self._no_input = True
                self._show(rank, _no_input_note(rank))
                self._run_on(session, rank)
                return
            self._show(rank, session.send(line)[rank])
        # a later stop (after `c`, or a step that ran long) is announced anew

    def _run_on(self, session: DebugSession, rank: int) -> None:
        session.send("c")

    def release(self, ranks: list[int]) -> list[int]:
        """End the pdb of each of ``ranks`` stopped at a breakpoint; the ranks released."""
        replies = control_request(self.ask, ranks, {"op": "release"}, 3.0)
        return [r for r, reply in replies.items() if reply.get("released")]


def _no_input_note(rank: int) -> str:
    return (
        f"stopped at breakpoint(), but this front end sends no input, so rank {rank} runs "
        f"on. To debug it, run the cell with %%mpi --noblock (cluster.run(..., "
        f"block=False)), then %mpi debug --ranks {rank} (cluster.debug([{rank}])); "
        "'c' lets it run on."
    )
