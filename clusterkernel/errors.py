"""Errors the client side raises, speaking in MPI ranks (client side).

:class:`RankError` is what a failed ``%%mpi`` cell (or :meth:`Cluster.run`) raises:
each distinct error is shown once with the ranks that raised it, so "Run all" stops
at the failing cell and the user sees ``ranks 0,2: ZeroDivisionError`` rather than
four copies of the same traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class ClusterError(RuntimeError):
    """The engine set could not be started, is not running, or was lost."""


def format_ranks(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    ranks = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


@dataclass
class RankFailure:
    """One distinct failure and the ranks that share it."""

    kind: str  # "error", "died", "timeout", "interrupted"
    summary: str  # one line, e.g. "ZeroDivisionError: division by zero"
    ranks: list[int] = field(default_factory=list)
    detail: str = ""  # traceback or stack, shown once


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Engine cell files are named per process (/tmp/ipykernel_<pid>/<hash>.py); strip
# that so identical errors on different ranks group together.
_PER_PROCESS = re.compile(r"ipykernel_\d+|0x[0-9a-f]+")


def _group_key(kind: str, summary: str) -> tuple:
    return kind, _PER_PROCESS.sub("", _ANSI.sub("", summary))


def group_failures(items: list[tuple[int, str, str, str]]) -> list[RankFailure]:
    """Group ``(rank, kind, summary, detail)`` tuples into distinct failures."""
    groups: dict[tuple, RankFailure] = {}
    for rank, kind, summary, detail in sorted(items):
        key = _group_key(kind, summary)
        if key not in groups:
            groups[key] = RankFailure(kind, summary, [], detail)
        groups[key].ranks.append(rank)
    return list(groups.values())


class RankError(RuntimeError):
    """A cell failed on one or more ranks.

    ``failures`` lists each distinct failure once with its ranks. IPython shows
    the grouped report (via ``_render_traceback_``) instead of a client-side
    traceback, which would only point into clusterkernel.

    Example::

        try:
            cluster.run("1/0")
        except RankError as e:
            print(e.failures[0].ranks)   # [0, 1, 2, 3]
    """

    def __init__(self, failures: list[RankFailure], note: str = ""):
        self.failures = failures
        self.note = note
        super().__init__(self._summary())

    @property
    def ranks(self) -> list[int]:
        return sorted({r for f in self.failures for r in f.ranks})

    def _summary(self) -> str:
        lines = [f"[ranks {format_ranks(f.ranks)}] {f.summary}" for f in self.failures]
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def render(self, color: bool = True) -> list[str]:
        lines: list[str] = []
        for f in self.failures:
            head = f"[ranks {format_ranks(f.ranks)}] {f.kind}: {f.summary}"
            lines.append(f"\x1b[0;31m{head}\x1b[0m" if color else head)
            if f.detail:
                detail = f.detail if color else _ANSI.sub("", f.detail)
                lines.extend(detail.rstrip("\n").splitlines())
        if self.note:
            lines.append(self.note)
        return lines

    def _render_traceback_(self) -> list[str]:
        return self.render(color=True)


class CellInterrupted(RankError):
    """The cell was interrupted (kernel interrupt or ``--timeout``)."""
