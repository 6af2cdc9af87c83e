"""Show each rank's output while a cell runs (client side).

Two renderers share one small interface (``update(rank, RankOutput)``,
``notice(text)``, ``finish()``). Both show a line that several ranks printed
identically once, named with its ranks (``[ranks 0-15] epoch 3 loss 0.41``), and
keep lines that differ apart, so 16 or 32 ranks stay readable.

- :class:`TerminalRenderer` prints complete lines, prefixed ``[rank N]`` (or
  ``[rank N stderr]``, ``[rank N output]``, ``Out[rank N]:``). New lines are held
  for ``hold`` seconds (0.2) from the first one, then the batch is printed:
  lower ranks first, each rank's lines in the order it printed them. A line that
  several ranks printed identically (same text, same stream) within the batch is
  printed once, ``[ranks 0-3] text``, where it comes next for all of them; if
  the ranks' lines cross (rank 0 printed a, b while rank 1 printed b, a), the
  lowest rank's line goes first and the copies print apart. Lines more than the
  hold apart print in the order they arrived; a line without its newline waits
  for it (or for the end of the cell).
- :class:`NotebookRenderer` shows one shared area, then one area per rank in
  rank order, all updated in place. A line that two or more ranks printed with
  the same text at the same line index (per stream; rich outputs and ``Out``
  count as items too) is shown once in the shared area under its ranks
  (``[ranks 0-15]``); every other line stays in its rank's area. A line that
  only one rank has printed so far waits ``hold`` seconds before it shows in that
  rank's area (the others usually catch up within that), so lines do not jump
  between areas while a cell streams. Quiet or fully shared ranks show nothing.

:func:`default_renderer` picks the one that suits the running shell;
:func:`group_lines` is the terminal's grouping on its own.
"""

from __future__ import annotations

import html
import json
import sys
import time
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from clusterkernel.errors import _ANSI, rank_label

T = TypeVar("T", bound=Hashable)


@dataclass
class RankOutput:
    """Everything one rank has produced so far in the current cell."""

    stdout: str = ""
    stderr: str = ""
    outputs: list = field(default_factory=list)  # display_data contents
    execute_result: dict | None = None

    def key(self) -> tuple:
        return (len(self.stdout), len(self.stderr), len(self.outputs), bool(self.execute_result))


class Renderer(Protocol):
    def update(self, rank: int, out: RankOutput) -> None: ...
    def notice(self, text: str) -> None: ...
    def finish(self) -> None: ...


def in_notebook() -> bool:
    """True inside a Jupyter kernel (display areas can be updated in place)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def default_renderer(ranks: list[int]) -> Renderer:
    return NotebookRenderer(ranks) if in_notebook() else TerminalRenderer(ranks)


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


def _plain(content: dict) -> str:
    return content.get("data", {}).get("text/plain", "")


class TerminalRenderer:
    """Print complete lines with their ranks, in rank order, identical ones once.

    ``hold`` (seconds) is how long new lines are gathered before they print;
    see the module docstring for the exact order.

    Example::

        r = TerminalRenderer([0, 1], hold=0)
        r.update(0, RankOutput(stdout="hi\\n"))
        r.update(1, RankOutput(stdout="hi\\n"))
        r.finish()    # prints "[ranks 0-1] hi"
    """

    hold = 0.2

    def __init__(self, ranks: list[int], stream=None, hold: float | None = None) -> None:
        self.ranks = ranks
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
            self._flush()
        items = [("stdout", line) for line in self._lines(rank, "stdout", out.stdout)]
        items += [("stderr", line) for line in self._lines(rank, "stderr", out.stderr)]
        items += [
            ("output", _plain(c) or "<rich output>")
            for c in out.outputs[self._shown_outputs.get(rank, 0) :]
        ]
        self._shown_outputs[rank] = len(out.outputs)
        if out.execute_result and rank not in self._shown_result:
            self._shown_result.add(rank)
            items.append(("result", _plain(out.execute_result)))
        if items:
            self._batch.setdefault(rank, []).extend(items)
            if self._batch_since is None:
                self._batch_since = now
        if self.hold <= 0:
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


_STYLE = (
    "<style>.ck-rank{margin:2px 0;border-left:3px solid #7a9cc6;padding-left:6px}"
    ".ck-rank b{font-family:monospace;color:#335}"
    ".ck-rank pre{margin:0;white-space:pre-wrap}"
    ".ck-err{background:#fdd}</style>"
)


def _rich_html(content: dict) -> str:
    data = content.get("data", {})
    if "text/html" in data:
        return data["text/html"]
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return f'<img src="data:{mime};base64,{data[mime]}"/>'
    if "image/svg+xml" in data:
        return data["image/svg+xml"]
    return f"<pre>{html.escape(data.get('text/plain', ''))}</pre>"


_KINDS = ("stdout", "stderr", "output", "result")


class NotebookRenderer:
    """A shared area for identical lines, then one area per rank, updated in place.

    See the module docstring for what goes where. ``shown()`` returns what each
    area shows now (its display data), shared area first, for tests and tools.

    Example::

        r = NotebookRenderer([0, 1, 2], hold=0)
        for rank in (0, 1, 2):
            r.update(rank, RankOutput(stdout=f"epoch 3\\nrank {rank}\\n"))
        r.finish()
        r.shown()[0]["text/plain"]   # "[ranks 0-2]\\nepoch 3"
        r.shown()[2]["text/plain"]   # "[rank 1]\\nrank 1"
    """

    min_interval = 0.1  # seconds between updates of one area
    hold = 0.2  # seconds a line only one rank has printed waits before it shows

    def __init__(self, ranks: list[int], hold: float | None = None) -> None:
        self.ranks = list(ranks)
        if hold is not None:
            self.hold = hold
        self._areas: list[int | None] = [None, *self.ranks]  # None: the shared area
        self._handles: dict[int | None, object] = {}
        self._bundles: dict[int | None, dict] = {}
        self._last: dict[int | None, float] = {}
        self._dirty: set[int | None] = set()
        self._keys: dict[int, tuple] = {}
        self._seen: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}
        # Each rank's items per kind, by index (a line's text, or a rich output's key).
        self._items: dict[tuple[int, str], list[str]] = {}
        self._content: dict[tuple[int, str, int], dict] = {}  # rich outputs, Out
        # Per (kind, index): which rank has which item there, and how many share it.
        self._at: dict[tuple[str, int], dict[int, str]] = {}
        self._counts: dict[tuple[str, int], Counter] = {}
        self._group_cache: dict[tuple[str, int], list[list[int]]] = {}
        self._born: dict[tuple[str, int, int], float] = {}
        self._young: deque[tuple[float, int]] = deque()
        self._final = False

    # ------------------------------------------------------------ the model
    def _set(self, rank: int, kind: str, index: int, item: str, now: float) -> None:
        items = self._items.setdefault((rank, kind), [])
        old = items[index] if index < len(items) else None
        if old == item:
            return
        if index < len(items):
            items[index] = item
        else:
            items.append(item)
        at = self._at.setdefault((kind, index), {})
        counts = self._counts.setdefault((kind, index), Counter())
        at[rank] = item
        self._group_cache.pop((kind, index), None)
        self._born.setdefault((kind, index, rank), now)
        # Redraw only the areas whose content changes: a rank's own area only when
        # the item there was or is its alone (shared items live in the shared area).
        for text, delta in ((old, -1), (item, +1)):
            if text is None:
                continue
            counts[text] += delta
            n = counts[text]
            if (delta < 0 and n == 0) or (delta > 0 and n == 1):
                self._dirty.add(rank)
                if delta > 0:
                    self._young.append((now, rank))  # shown once the hold has passed
            if n >= 2 or (delta < 0 and n == 1):
                self._dirty.add(None)
            if (delta > 0 and n == 2) or (delta < 0 and n == 1):
                # The other holder moves between its own area and the shared one.
                self._dirty.update(r for r, t in at.items() if t == text and r != rank)

    def _ingest_text(self, rank: int, kind: str, text: str, now: float) -> None:
        key = (rank, kind)
        seen = self._seen.get(key, 0)
        if len(text) == seen:
            return
        buf = self._partial.get(key, "") + text[seen:]
        self._seen[key] = len(text)
        lines = buf.split("\n")
        tail = lines.pop()
        first = len(self._items.get(key, [])) - (1 if self._partial.get(key) else 0)
        for i, line in enumerate(lines):
            self._set(rank, kind, first + i, line, now)
        if tail:
            self._set(rank, kind, first + len(lines), tail, now)
        self._partial[key] = tail

    def _ingest_rich(self, rank: int, kind: str, contents: list[dict], now: float) -> None:
        done = len(self._items.get((rank, kind), []))
        for i, content in enumerate(contents[done:], done):
            self._content[(rank, kind, i)] = content
            self._set(rank, kind, i, json.dumps(content.get("data", {}), sort_keys=True), now)

    def _groups(self, kind: str, index: int) -> list[list[int]]:
        """The rank sets sharing an item at ``(kind, index)``, lowest rank first (cached)."""
        key = (kind, index)
        cached = self._group_cache.get(key)
        if cached is None:
            groups: dict[str, list[int]] = {}
            for r, item in self._at[key].items():
                groups.setdefault(item, []).append(r)
            cached = sorted(sorted(g) for g in groups.values() if len(g) >= 2)
            self._group_cache[key] = cached
        return cached

    def _shared(self, rank: int, kind: str, index: int) -> bool:
        item = self._at[(kind, index)][rank]
        return self._counts[(kind, index)][item] >= 2

    # ------------------------------------------------------------ rendering
    def _html_items(self, rank: int, items: list[tuple[str, int]]) -> list[str]:
        parts: list[str] = []
        run: list[str] = []
        run_kind = None
        for kind, i in [*items, ("", -1)]:
            if run and kind != run_kind:
                cls = " class='ck-err'" if run_kind == "stderr" else ""
                text = html.escape(_ANSI.sub("", "\n".join(run)))
                parts.append(f"<pre{cls}>{text}</pre>")
                run = []
            if kind in ("stdout", "stderr"):
                run.append(self._items[(rank, kind)][i])
                run_kind = kind
            elif kind == "output":
                parts.append(_rich_html(self._content[(rank, kind, i)]))
            elif kind == "result":
                parts.append(f"<div>Out: {_rich_html(self._content[(rank, kind, i)])}</div>")
        return parts

    def _text_items(self, rank: int, label: str, items: list[tuple[str, int]]) -> list[str]:
        out = []
        for kind, i in items:
            if kind in ("stdout", "stderr"):
                out.append(self._items[(rank, kind)][i])
            elif kind == "output":
                out.append(_plain(self._content[(rank, kind, i)]))
            else:
                out.append(f"Out[{label}]: {_plain(self._content[(rank, kind, i)])}")
        return out

    def _blocks(self, area: int | None, now: float) -> list[tuple[list[int], list]]:
        """``(ranks, [(kind, index), ...])`` blocks an area shows, in order."""
        if area is not None:
            items = []
            for kind in _KINDS:
                for i in range(len(self._items.get((area, kind), []))):
                    if self._shared(area, kind, i):
                        continue
                    young = now - self._born[(kind, i, area)] < self.hold
                    if young and not self._final:
                        continue
                    items.append((kind, i))
            return [([area], items)] if items else []
        blocks: list[tuple[list[int], list]] = []
        for kind in _KINDS:
            i = 0
            while (kind, i) in self._at:
                for ranks in self._groups(kind, i):
                    if blocks and blocks[-1][0] == ranks:
                        blocks[-1][1].append((kind, i))
                    else:
                        blocks.append((ranks, [(kind, i)]))
                i += 1
        return blocks

    def _bundle(self, area: int | None, now: float) -> dict:
        html_parts: list[str] = []
        text_parts: list[str] = []
        for ranks, items in self._blocks(area, now):
            label = rank_label(ranks)
            html_parts.append(f"<div class='ck-rank'><b>[{label}]</b>")
            html_parts += self._html_items(ranks[0], items)
            html_parts.append("</div>")
            text_parts += [f"[{label}]", *self._text_items(ranks[0], label, items)]
        if not text_parts:
            return {"text/plain": ""}
        return {"text/html": _STYLE + "".join(html_parts), "text/plain": "\n".join(text_parts)}

    def _ensure_areas(self) -> None:
        if self._handles:
            return
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        # All areas at once, in order, the first time anything is shown; empty
        # areas render as nothing, so a quiet cell shows nothing at all. Without
        # a shell, display() would print; the model (shown()) is all there is.
        live = InteractiveShell.initialized()
        for area in self._areas:
            handle = display({"text/plain": ""}, raw=True, display_id=True) if live else None
            self._handles[area] = handle

    def _draw_due(self, force: bool) -> None:
        now = time.monotonic()
        while self._young and now - self._young[0][0] >= self.hold:
            self._dirty.add(self._young.popleft()[1])
        for area in [a for a in self._areas if a in self._dirty]:
            if not force and now - self._last.get(area, 0.0) < self.min_interval:
                continue
            self._dirty.discard(area)
            bundle = self._bundle(area, now)
            if bundle == self._bundles.get(area, {"text/plain": ""}):
                continue
            self._ensure_areas()
            self._bundles[area] = bundle
            self._last[area] = now
            handle = self._handles[area]
            if handle is not None:  # None: no IPython shell to display in
                handle.update(bundle, raw=True)

    def update(self, rank: int, out: RankOutput) -> None:
        key = out.key()
        if self._keys.get(rank) != key:
            self._keys[rank] = key
            now = time.monotonic()
            self._ingest_text(rank, "stdout", out.stdout, now)
            self._ingest_text(rank, "stderr", out.stderr, now)
            self._ingest_rich(rank, "output", out.outputs, now)
            result = [out.execute_result] if out.execute_result else []
            self._ingest_rich(rank, "result", result, now)
        self._draw_due(force=False)

    def shown(self) -> list[dict]:
        """What each area shows now, shared area first, then ranks in order."""
        return [self._bundles.get(area, {"text/plain": ""}) for area in self._areas]

    def notice(self, text: str) -> None:
        from IPython.display import display

        # the ranks' areas stay above a notice (and the prompt that may follow it)
        self._draw_due(force=True)
        self._ensure_areas()
        display({"text/plain": text}, raw=True)

    def finish(self) -> None:
        self._final = True
        self._dirty.update(self._areas)
        self._draw_due(force=True)
