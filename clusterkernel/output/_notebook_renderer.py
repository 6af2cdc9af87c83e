"""The notebook's view of a running cell: a shared area, then one per rank (client side).

:class:`NotebookRenderer` shows one shared area, then one area per rank in rank
order, all updated in place. A line that two or more ranks printed with the same
text at the same line index (per stream; rich outputs and ``Out`` count as items
too) is shown once in the shared area under its ranks (``[ranks 0-15]``); every
other line stays in its rank's area. A line that only one rank has printed so far
waits ``hold`` seconds before it shows in that rank's area (the others usually
catch up within that), so lines do not jump between areas while a cell streams.
Quiet or fully shared ranks show nothing.

Example::

    r = NotebookRenderer([0, 1], hold=0)
    r.update(0, RankOutput(stdout="epoch 3\\n"))
    r.update(1, RankOutput(stdout="epoch 3\\n"))
    r.finish()
    r.shown()[0]["text/plain"]   # "[ranks 0-1]\\nepoch 3"
"""

from __future__ import annotations

import html
import json
import time
from collections import Counter, deque

from clusterkernel.errors import _ANSI, rank_label
from clusterkernel.output._rank_output import RankOutput, plain_text

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
                out.append(plain_text(self._content[(rank, kind, i)]))
            else:
                out.append(f"Out[{label}]: {plain_text(self._content[(rank, kind, i)])}")
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
