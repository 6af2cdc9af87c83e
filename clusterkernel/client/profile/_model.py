"""The Profile: each rank's samples over a cell, its tables, its difference view, its HTML."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from clusterkernel.client.errors import format_ranks
from clusterkernel.client.profile import _export
from clusterkernel.client.profile._collectives import CollectiveTime, collective_split
from clusterkernel.client.profile._flame import cell_file, flame_tree, icicle_svg, where
from clusterkernel.client.profile._flame import short_path as _short
from clusterkernel.protocol.records import UNNUMBERED_CELL

if TYPE_CHECKING:
    import os
    from pathlib import Path
_LIBRARY = re.compile(
    r"[/\\]lib[/\\]python3[^/\\]*[/\\]|[/\\](site|dist)-packages[/\\]|[/\\]clusterkernel[/\\]"
    r"|^<frozen "
)
_WAITS = re.compile(r"[/\\]clusterkernel[/\\]comm[/\\]|[/\\]torch[/\\]distributed[/\\]")
CELL = UNNUMBERED_CELL
"""The file of the lines of a cell the notebook gave no number (``cluster.run`` from a
script): ``%%mpi cell``; a numbered cell's lines have ``Cell In[7]``, as IPython names it."""


@dataclass(frozen=True)
class ProfileEntry:
    """Seconds one rank spent at one line of code (its own, or a call it made from there).

    ``file``: the path (``Cell In[7]`` for a cell's lines, :data:`CELL` for a cell
    without a number), ``line``, ``function``,
    ``seconds``, ``percent`` of the rank's profiled time, ``inside``: where the time
    went when it was in a library (``"time.py: sleep"``-like), else "".

    Example::

        e = profile.top(0)[0]
        f"{e.where}  {e.function}  {e.seconds:.2f}s"
    """

    file: str
    line: int
    function: str
    seconds: float
    percent: float
    inside: str = ""

    @property
    def where(self) -> str:
        """``file:line`` as read in a table; ``Cell In[7], line 4`` for a cell's lines."""
        return where(self.file, self.line)


@dataclass(frozen=True)
class DifferenceEntry:
    """One line's seconds on the slowest rank against the median rank's.

    Example::

        d = profile.difference()[0]
        f"{d.where} {d.function}: +{d.extra:.2f}s on rank {profile.slowest}"
    """

    file: str
    line: int
    function: str
    slowest: float
    median: float

    @property
    def extra(self) -> float:
        """Seconds more on the slowest rank."""
        return self.slowest - self.median

    @property
    def where(self) -> str:
        """``file:line`` (``Cell In[7], line 4`` for a cell's lines)."""
        return where(self.file, self.line)


class Profile:
    """Each rank's sampled stacks over one cell; tables per rank and the straggler's difference.

    ``ranks``: ``{rank: data}`` as each rank's sampler returned it; ``missing``:
    ranks that gave none (gone, restarted); ``notes``: ``{rank: why}`` for ranks whose
    samples were lost or cut short; ``snapshots``: the windows of a profile started
    with ``every`` (``_live.Snapshot``), else empty. ``str(profile)`` is the text shown under
    the cell in a terminal, ``_repr_html_`` the notebook's.

    Example::

        p = cluster.run(code, profile=True) and cluster.profile_result
        p.slowest, p.median_rank      # 2, 1
        p.top(2, n=5)                 # rank 2's five lines with the most time
    """

    def __init__(
        self,
        ranks: dict[int, dict],
        missing: list[int] | None = None,
        notes: dict[int, str] | None = None,
    ) -> None:
        self.ranks = dict(sorted(ranks.items()))
        self.missing = sorted(missing or [])
        self.notes = dict(sorted((notes or {}).items()))
        self.snapshots: list = []
        self._own = {r: _own_lines(d) for r, d in self.ranks.items()}
        self._split: dict[int, CollectiveTime] | None = None

    # ---------------------------------------------------------------- numbers
    def seconds(self, rank: int) -> float:
        """The wall time rank ``rank`` was profiled (the cell's time on it)."""
        return float(self.ranks[rank].get("seconds", 0.0))

    def between(self, rank: int) -> float:
        """Seconds rank ``rank``'s engine spent outside cells: waiting for the next one
        (``%mpi profile start|stop`` spans several), answering the notebook. Not shown
        among the top lines: no code of the user's ran.

        Example::

            profile.in_cells(0), profile.between(0)   # (2.31, 8.12)
        """
        return sum(
            secs for thread, stack, secs in self.ranks[rank].get("stacks", [])
            if thread == "main" and not stack
        )  # fmt: skip

    def in_cells(self, rank: int) -> float:
        """Seconds rank ``rank`` ran cells while profiled (its top lines' 100 %)."""
        return max(self.seconds(rank) - self.between(rank), 0.0)

    def busy(self, rank: int) -> float:
        """Profiled seconds less the main thread's time inside collectives (waiting)
        and between cells (idle: ``%mpi profile start|stop`` spans several cells)."""
        waits = sum(
            secs
            for thread, stack, secs in self.ranks[rank].get("stacks", [])
            if thread == "main" and (not stack or any(_WAITS.search(f[0]) for f in stack))
        )
        return self.seconds(rank) - waits

    @property
    def slowest(self) -> int | None:
        """The rank with the most busy time (None without profiles)."""
        if not self.ranks:
            return None
        return max(self.ranks, key=lambda r: (self.busy(r), -r))

    @property
    def median_rank(self) -> int | None:
        """The rank of the lower median busy time (None with fewer than two ranks)."""
        if len(self.ranks) < 2:
            return None
        order = sorted(self.ranks, key=lambda r: (self.busy(r), r))
        return order[(len(order) - 1) // 2]

    def collectives(self) -> dict[int, CollectiveTime]:
        """Each rank's seconds in comm calls, split into moving data and waiting for
        other ranks (``_collectives``); ranks whose comm layer recorded nothing are left out.

        Example::

            profile.collectives()[0].waiting   # seconds rank 0 waited for the others
        """
        if self._split is None:
            self._split = collective_split(self.ranks)
        return self._split

    def top(self, rank: int, n: int = 10) -> list[ProfileEntry]:
        """Rank ``rank``'s ``n`` lines with the most time, most first; ``percent`` of
        its time in cells (:meth:`in_cells`)."""
        total = self.in_cells(rank) or 1.0
        rows = sorted(self._own[rank].items(), key=lambda kv: -kv[1][0])[:n]
        return [
            ProfileEntry(f, ln, fn, secs, 100.0 * secs / total, _inside(inside))
            for (f, ln, fn), (secs, inside) in rows
        ]

    def difference(self, n: int = 10) -> list[DifferenceEntry]:
        """The ``n`` lines where the slowest rank spends the most more than the median rank."""
        slow, med = self.slowest, self.median_rank
        if slow is None or med is None or slow == med:
            return []
        a, b = self._own[slow], self._own[med]
        rows = [
            DifferenceEntry(*key, slowest=a.get(key, (0.0, {}))[0], median=b.get(key, (0.0, {}))[0])
            for key in set(a) | set(b)
        ]
        rows = [d for d in rows if d.extra >= 0.0005]  # what a table shows as +0.000 is not more
        return sorted(rows, key=lambda d: -d.extra)[:n]

    # ---------------------------------------------------------------- exporting
    def speedscope(self) -> dict:
        """The profile in speedscope's file format (one sampled profile per rank and thread).

        Example::

            doc = profile.speedscope(); doc["profiles"][0]["name"]   # 'rank 0'
        """
        return _export.speedscope(self.ranks)

    def chrome_trace(self, store: Any = None) -> dict:
        """The profile as a Chrome trace-event document, one process per rank; with a
        dashboard's store (``dashboard.store``) its comm and compute tracks merged in.

        Example::

            doc = profile.chrome_trace(); doc["traceEvents"][0]["ph"]   # 'M'
        """
        return _export.chrome_trace(self.ranks, store)

    def save(self, path: str | os.PathLike, store: Any = None) -> Path:
        """Write ``NAME.speedscope.json`` (speedscope) or ``NAME.json`` (Chrome/Perfetto
        trace; ``store``: a dashboard's records merged in); the path written.

        Example::

            cluster.profile_result.save("step.speedscope.json")   # open in speedscope.app
            cluster.profile_result.save("step.trace.json")        # open in ui.perfetto.dev
        """
        return _export.save(self.ranks, path, store)

    # ---------------------------------------------------------------- showing
    def _comm_line(self, rank: int) -> str:
        t = self.collectives().get(rank)
        if t is None or t.total <= 0:
            return ""
        line = (
            f"in comm calls {t.total:.3f} s: moving data {t.moving:.3f} s, "
            f"waiting for other ranks {t.waiting:.3f} s"
        )
        return line + (f", not split {t.unsplit:.3f} s" if t.unsplit > 0 else "")

    def _title(self, rank: int) -> str:
        """``2.31 s``; ``2.31 s in cells, 8.10 s between them`` over several cells."""
        idle = self.between(rank)
        text = f"{self.in_cells(rank):.2f} s"
        return text + (f" in cells, {idle:.2f} s between them" if idle >= _SHOWN_IDLE else "")

    def __str__(self) -> str:
        out = []
        for rank in self.ranks:
            comm = self._comm_line(rank)
            out.append(
                f"Profile of rank {rank}: {self._title(rank)}" + (f" ({comm})" if comm else "")
            )
            out.append(_text_table(_TOP_HEAD, [_top_row(e) for e in self.top(rank)]))
        out += self._difference_text()
        out += self._lost_lines()
        return "\n".join(out)

    def _lost_lines(self) -> list[str]:
        """Which ranks' samples were lost or cut short, and why."""
        out = [f"Rank {r}: {why}." for r, why in self.notes.items()]
        rest = [r for r in self.missing if r not in self.notes]
        if rest:
            out.append(f"No profile from rank {format_ranks(rest)} (gone or restarted).")
        return out

    def __repr__(self) -> str:
        return f"<Profile ranks={format_ranks(list(self.ranks))} slowest={self.slowest}>"

    def _difference_text(self) -> list[str]:
        slow, med = self.slowest, self.median_rank
        if med is None or slow == med:
            return []
        rows = self.difference()
        slow = cast(int, slow)  # a median rank means two ranks or more
        head = (
            f"What the slowest rank does more: rank {slow} ({self.busy(slow):.2f} s busy) "
            f"vs the median rank {med} ({self.busy(med):.2f} s)"
        )
        table = [_diff_row(d) for d in rows]
        return [head, _text_table(_DIFF_HEAD, table) if table else "  (nothing stands out)"]

    def _repr_html_(self) -> str:
        parts = []
        slow, med = self.slowest, self.median_rank
        if med is not None and slow != med:
            slow = cast(int, slow)  # a median rank means two ranks or more
            parts.append(
                f"<b>What the slowest rank does more</b>: rank {slow} "
                f"({self.busy(slow):.2f} s busy) vs the median rank {med} "
                f"({self.busy(med):.2f} s)"
            )
            rows = [_diff_row(d) for d in self.difference()]
            parts.append(_html_table(_DIFF_HEAD, rows) if rows else "<i>nothing stands out</i>")
        cells = []
        for rank in self.ranks:
            title = f"<b>rank {rank}</b>: {html.escape(self._title(rank))}"
            comm = self._comm_line(rank)
            if comm:
                title += f"<br><small>{html.escape(comm)}</small>"
            rows = [_top_row(e) for e in self.top(rank)]
            cells.append(
                f"<div style='margin:4px 12px 4px 0'>{title}{_html_table(_TOP_HEAD, rows)}</div>"
            )
        parts.append(f"<div style='display:flex;flex-wrap:wrap'>{''.join(cells)}</div>")
        parts.append(self._flames_html())
        parts += [f"<div><i>{html.escape(line)}</i></div>" for line in self._lost_lines()]
        return "<div class='ck-profile'>" + "".join(parts) + "</div>"

    def _flames_html(self) -> str:
        """Each rank's icicle, all to one scale (a slower rank's is wider), in a
        ``<details>`` that starts open for up to 8 ranks."""
        trees = {r: flame_tree(d, f"rank {r}") for r, d in self.ranks.items()}
        scale = max((t.seconds for t in trees.values()), default=0.0) or 1.0
        rows = []
        for rank, tree in trees.items():
            mark = " (slowest)" if rank == self.slowest and len(trees) > 1 else ""
            rows.append(
                f"<div style='margin:2px 0'><small>rank {rank}{mark}</small>"
                f"{icicle_svg(tree, scale, f'flame graph of rank {rank}')}</div>"
            )
        state = " open" if len(trees) <= 8 else ""
        return (
            f"<details{state}><summary>Flame graphs (outermost call on top; width: seconds; "
            f"hover a box for its file and line)</summary>{''.join(rows)}</details>"
        )

    def show(self) -> None:
        """Show under the running cell: HTML in a notebook, text in a terminal.

        Example::

            cluster.profile_result.show()
        """
        from clusterkernel.client.output import in_notebook

        if in_notebook():
            from IPython.display import display

            display(self)
        else:
            print(self, flush=True)


# -------------------------------------------------------------------- helpers
_TOP_HEAD = ("where", "function", "seconds", "%", "in")
# time between cells under this is the start and stop of one profiled cell: not told
_SHOWN_IDLE = 0.5
_DIFF_HEAD = ("where", "function", "slowest s", "median s", "more s")


def _top_row(e: ProfileEntry) -> tuple[str, ...]:
    return (e.where, e.function, f"{e.seconds:.3f}", f"{e.percent:.1f}", e.inside)


def _diff_row(d: DifferenceEntry) -> tuple[str, ...]:
    return (d.where, d.function, f"{d.slowest:.3f}", f"{d.median:.3f}", f"+{d.extra:.3f}")


def _own_lines(data: dict) -> dict[tuple[str, int, str], tuple[float, dict[str, float]]]:
    """``{(file, line, function): (seconds, {library frame: seconds})}``: each sample at
    its innermost frame outside the libraries (the whole stack's innermost if none);
    the time between cells (an empty stack: no code ran) is left out."""
    out: dict[tuple[str, int, str], tuple[float, dict[str, float]]] = {}
    for _thread, stack, secs in data.get("stacks", []):
        if not stack:
            continue
        own = [f for f in stack if not _LIBRARY.search(f[0])]
        file, line, func = own[-1] if own else stack[-1]
        # a frame between bytecodes can have no line number (f_lineno is None)
        key = (cell_file(file), int(line or 0), func)
        leaf = stack[-1]
        inside = "" if (own and leaf == own[-1]) else f"{_short(leaf[0])}: {leaf[2]}"
        total, where = out.get(key, (0.0, {}))
        if inside:
            where[inside] = where.get(inside, 0.0) + secs
        out[key] = (total + secs, where)
    return out


def _inside(where: dict[str, float]) -> str:
    """The library function that took most of a line's time."""
    return max(where, key=where.__getitem__) if where else ""


def _text_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    for row in rows:
        lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _html_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    th = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
