"""The terminal's view of a running cell: complete lines with their ranks (client side).

:class:`TerminalRenderer` prints complete lines, prefixed ``[rank N]`` (or
``[rank N stderr]``, ``[rank N output]``, ``Out[rank N]:``). New lines are held
for ``hold`` seconds (0.2) from the first one, then the batch is printed: lower
ranks first, each rank's lines in the order it printed them. A line that several
ranks printed identically (same text, same stream) within the batch is printed
once, ``[ranks 0-3] text``, where it comes next for all of them; if the ranks'
lines cross (rank 0 printed a, b while rank 1 printed b, a), the lowest rank's
line goes first and the copies print apart. Lines more than the hold apart print
in the order they arrived; a line without its newline waits for it (or for the
end of the cell). :func:`group_lines` is that grouping on its own.

Ranks of a fresh engine set reach the same ``print`` up to a second apart (one is
still importing torch). So a batch also waits, up to ``peer_wait`` seconds (1.0),
until every rank of the cell has printed as many lines as the batch's furthest
rank: lines that all ranks print at the same point come out in rank order. A rank
that does not catch up within that time is not waited for again in this cell, so a
rank that prints alone (``if rank == 0: print(...)``) is held back once, by at most
``peer_wait``, and then streams with the plain ``hold``.

Example::

    r = TerminalRenderer([0, 1])
    r.update(0, RankOutput(stdout="hi\\n"))
    r.update(1, RankOutput(stdout="hi\\n"))
    r.finish()    # prints "[ranks 0-1] hi"
"""

from __future__ import annotations

import sys
import time
from collections import Counter, deque
from collections.abc import Hashable
from typing import TypeVar, cast

from clusterkernel.client.errors import rank_label
from clusterkernel.client.output._rank_output import RankOutput, plain_text

T = TypeVar("T", bound=Hashable)


def group_lines(batch: dict[int, list[T]]) -> list[tuple[list[int], T]]:
    """Merge each rank's new lines into one list, naming the ranks of shared lines.

    Lower ranks go first and every rank's lines keep their order. A line is
    printed together for all ranks whose next line it is, once no rank still
    has an earlier copy of it waiting behind other lines (so ``s0, done`` /
    ``s1, done`` gives ``s0``, ``s1``, then ``done`` for both). When every rank's
    next line is also waiting further back in another rank, the lowest rank's
    next line goes first, which always makes progress.

    Example::

        group_lines({0: ["a", "x0"], 1: ["a", "x1"]})
        # [([0, 1], "a"), ([0], "x0"), ([1], "x1")]
    """
    queues = {r: deque(items) for r, items in sorted(batch.items()) if items}
    pending = Counter(item for q in queues.values() for item in q)
    heads = Counter(q[0] for q in queues.values())
    out: list[tuple[list[int], T]] = []
    while queues:
        order = list(queues)  # insertion order is rank order
        pick = next((r for r in order if pending[queues[r][0]] == heads[queues[r][0]]), order[0])
        item = queues[pick][0]
        members = [r for r in order if queues[r][0] == item]
        out.append((members, item))
        for r in members:
            q = queues[r]
            q.popleft()
            pending[item] -= 1
            heads[item] -= 1
            if q:
                heads[q[0]] += 1
            else:
                del queues[r]
    return out


class TerminalRenderer:
    """Print complete lines with their ranks, in rank order, identical ones once.

    ``hold`` (seconds) is how long new lines are gathered before they print;
    see the module docstring for the exact order.

    Example::

        r = TerminalRenderer([0, 1])
        r.update(0, RankOutput(stdout="hi\\n"))
        r.update(1, RankOutput(stdout="hi\\n"))
        r.finish()    # prints "[ranks 0-1] hi"
    """

    hold = 0.2
    peer_wait = 1.0

    def __init__(self, ranks: list[int], stream=None, hold: float | None = None) -> None:
        self.ranks = ranks
        self._printed = dict.fromkeys(ranks, 0)  # lines each rank has produced so far
        self._not_waited_for: set[int] = set()  # ranks that did not catch up once
        self.stream = stream
        if hold is not None:
            self.hold = hold
        self._seen: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}
        self._shown_outputs: dict[int, int] = {}
        self._shown_result: set[int] = set()
        self._batch: dict[int, list[tuple[str, str]]] = {}
        self._batch_since: float | None = None
        self._last_rank: int | None = None

    def _out(self):
        return self.stream or sys.stdout

    def _lines(self, rank: int, name: str, text: str, final: bool = False) -> list[str]:
        key = (rank, name)
        new = text[self._seen.get(key, 0) :]
        self._seen[key] = len(text)
        buf = self._partial.get(key, "") + new
        lines = buf.split("\n")
        self._partial[key] = "" if final else lines.pop()
        if final and lines and lines[-1] == "":
            lines.pop()
        return lines

    def update(self, rank: int, out: RankOutput) -> None:
        now = time.monotonic()
        # Print only between rounds (the runner updates every rank in rank order),
        # so lines that arrived in one round are never split across two batches.
        new_round = self._last_rank is None or rank <= self._last_rank
        self._last_rank = rank
        if new_round and self._batch_since is not None and now - self._batch_since >= self.hold:
            self._flush_unless_peers_behind(now)
        items = [("stdout", line) for line in self._lines(rank, "stdout", out.stdout)]
        items += [("stderr", line) for line in self._lines(rank, "stderr", out.stderr)]
        items += [
            ("output", plain_text(c) or "<rich output>")
            for c in out.outputs[self._shown_outputs.get(rank, 0) :]
        ]
        self._shown_outputs[rank] = len(out.outputs)
        if out.execute_result and rank not in self._shown_result:
            self._shown_result.add(rank)
            items.append(("result", plain_text(out.execute_result)))
        if items:
            self._printed[rank] = self._printed.get(rank, 0) + len(items)
            self._batch.setdefault(rank, []).extend(items)
            if self._batch_since is None:
                self._batch_since = now
        if self.hold <= 0:
            self._flush()

    def _flush_unless_peers_behind(self, now: float) -> None:
        """Print the batch, unless ranks that have not yet printed as far as the batch's
        furthest rank may still catch up (see the module)."""
        furthest = max((self._printed[r] for r in self._batch), default=0)
        behind = [
            r
            for r in self.ranks
            if r not in self._not_waited_for and self._printed.get(r, 0) < furthest
        ]
        if behind and now - cast(float, self._batch_since) < self.peer_wait:  # set with the batch
            return
        self._not_waited_for.update(behind)
        self._flush()

    def _flush(self) -> None:
        batch, self._batch, self._batch_since = self._batch, {}, None
        for ranks, (kind, text) in group_lines(batch):
            label = rank_label(ranks)
            if kind == "stdout":
                line = f"[{label}] {text}"
            elif kind == "result":
                line = f"Out[{label}]: {text}"
            else:
                line = f"[{label} {kind}] {text}"
            print(line, file=self._out())

    def notice(self, text: str) -> None:
        self._flush()
        print(text, file=self._out())

    def finish(self) -> None:
        for (rank, name), rest in list(self._partial.items()):
            if rest:
                self._batch.setdefault(rank, []).append((name, rest))
        self._partial.clear()
        self._flush()
        out = self._out()
        if hasattr(out, "flush"):
            out.flush()
