"""Errors the client side raises, speaking in MPI ranks (client side).

:class:`RankError` is what a failed ``%%mpi`` cell (or :meth:`Cluster.run`) raises:
each distinct error is shown once with the ranks that raised it, so "Run all" stops
at the failing cell and the user sees ``ranks 0,2: ZeroDivisionError`` rather than
four copies of the same traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from clusterkernel.protocol._errors import ClusterkernelError


class ClusterError(ClusterkernelError, RuntimeError):
    """The engine set could not be started, is not running, or was lost."""


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``.

    Example::

        format_ranks([3, 0, 1, 2, 7])   # "0-3,7"
    """
    ranks = sorted(set(ranks))
    parts: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set
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


def rank_label(ranks: Iterable[int]) -> str:
    """``"rank 1"`` for one rank, ``"ranks 1,3"`` or ``"ranks 0-15"`` for several.

    Example::

        f"[{rank_label([1])}] boom"       # "[rank 1] boom"
        f"[{rank_label([0, 1, 2])}] ok"   # "[ranks 0-2] ok"
    """
    ranks = set(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def headline(kind: str, summary: str) -> str:
    """``kind: summary``, without repeating a kind that the summary already starts with.

    Example::

        headline("error", "ValueError: no")                       # "error: ValueError: no"
        headline("interrupted", "interrupted; stopped by SIGINT")  # "interrupted; stopped ..."
    """
    if not kind or summary.lower().startswith(kind.lower()):
        return summary
    return f"{kind}: {summary}" if summary else kind


# How IPython names a cell in a traceback: "Cell In[4], line 2" (IPython 8.4+),
# "Input In [4]" (8.0-8.3), with colour codes between the words. On a rank the
# number is that engine's own counter, which means nothing to the user.
_C = r"(?:\x1b\[[0-9;]*m)*"
_ENGINE_CELL = re.compile(rf"((?:Cell{_C} {_C}In|Input{_C} {_C}In {_C})\[)\d+(\])")


def notebook_execution_count() -> int | None:
    """The ``N`` of the IPython cell running now (``In [N]``), or None outside a cell.

    IPython advances ``shell.execution_count`` before a cell runs, so the running
    cell's own number is the one on its execution result.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else None


# a SyntaxError's message names the engine's file of the cell (ipykernel's hash of it):
# "invalid syntax (3855724513.py, line 1)", where its traceback says "Cell In[4], line 1"
_ENGINE_FILE = re.compile(r"\((?:\S*/)?\d+\.py, (line \d+)\)")


def retitle_cell(text: str, execution_count: int | None) -> str:
    """Replace the engine's ``Cell In[N]`` (and the file a SyntaxError's message names)
    with the user's cell, or ``%%mpi cell``.

    Example::

        retitle_cell("Cell In[4], line 2", 12)     # "Cell In[12], line 2"
        retitle_cell("Cell In[4], line 2", None)   # "%%mpi cell, line 2"
        retitle_cell("SyntaxError: invalid syntax (3855724513.py, line 1)", 12)
        # "SyntaxError: invalid syntax (Cell In[12], line 1)"
    """
    cell = "%%mpi cell" if execution_count is None else f"Cell In[{execution_count}]"
    text = _ENGINE_FILE.sub(lambda m: f"({cell}, {m.group(1)})", text)
    if execution_count is None:
        return _ENGINE_CELL.sub("%%mpi cell", text)
    return _ENGINE_CELL.sub(rf"\g<1>{execution_count}\g<2>", text)


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


# A rank-side message that names its own rank first, as clusterkernel's do
# ("rank 3 on node2: this host has no GPU"): the same words for every rank but that.
_NAMES_ITS_RANK = re.compile(r"^rank \d+ on (\S+?): ")


def rank_error_lines(items: Iterable[tuple[int, str, str]]) -> list[str]:
    """``(rank, error name, message)`` as lines, each distinct error once with its ranks
    (and hosts, where the message named its own rank and host).

    Example::

        rank_error_lines([(0, "ValueError", "rank 0 on n1: no GPU"),
                          (1, "ValueError", "rank 1 on n1: no GPU")])
        # ['[ranks 0-1 on n1] ValueError: no GPU']
    """
    groups: dict[tuple[str, str], tuple[list[int], list[str]]] = {}
    for rank, name, message in sorted(items):
        named = _NAMES_ITS_RANK.match(message)
        key = (name, message[named.end() :] if named else message)
        ranks, hosts = groups.setdefault(key, ([], []))
        ranks.append(rank)
        if named and named.group(1) not in hosts:
            hosts.append(named.group(1))
    return [
        f"[{rank_label(ranks)}{' on ' + ', '.join(hosts) if hosts else ''}] {name}: {rest}"
        for (name, rest), (ranks, hosts) in groups.items()
    ]


class RankError(ClusterkernelError, RuntimeError):
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

    def __init__(
        self, failures: list[RankFailure], note: str = "", execution_count: int | None = None
    ):
        self.failures = failures
        self.note = note
        # The user's cell that ran the code, for tracebacks. Errors are made while
        # that cell still runs (``%%mpi`` blocks), so IPython's counter names it;
        # a runner that knows better (``--noblock``, waited on later) sets it.
        self.execution_count = (
            execution_count if execution_count is not None else notebook_execution_count()
        )
        super().__init__(self._summary())

    @property
    def ranks(self) -> list[int]:
        return sorted({r for f in self.failures for r in f.ranks})

    def _summary(self) -> str:
        lines = [
            f"[{rank_label(f.ranks)}] {retitle_cell(f.summary, self.execution_count)}"
            for f in self.failures
        ]
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def render(self, color: bool = True) -> list[str]:
        lines: list[str] = []
        for f in self.failures:
            head = f"[{rank_label(f.ranks)}] {headline(f.kind, f.summary)}"
            head = retitle_cell(head, self.execution_count)
            lines.append(f"\x1b[0;31m{head}\x1b[0m" if color else head)
            if f.detail:
                detail = f.detail if color else _ANSI.sub("", f.detail)
                detail = retitle_cell(detail, self.execution_count)
                lines.extend(detail.rstrip("\n").splitlines())
        if self.note:
            lines.append(self.note)
        return lines

    def _render_traceback_(self) -> list[str]:
        return self.render(color=True)


class CellInterrupted(RankError):
    """The cell was interrupted (kernel interrupt or ``--timeout``)."""
