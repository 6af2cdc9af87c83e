"""The notebook's view of a running cell: a shared area, then one per rank (client side).

:class:`NotebookRenderer` shows one shared area, then one area per rank in rank
order, all updated in place. Each rank's output is a list of messages in the order
they came (a line, a warning with its source line, a traceback, a rich output,
``Out``: :mod:`clusterkernel.client.output._entries`). The messages that open a rank's
output the same way as at least one other rank's are shown once in the shared area
under their ranks (``[ranks 0-15]``); from a rank's first message of its own on,
everything it printed stays in its own area, in order, so a message is never split
and never shown above one its rank printed earlier. A message only one rank has
printed so far waits ``hold`` seconds before it shows in that rank's area (the others
usually catch up within that), so lines do not jump between areas while a cell
streams. Quiet or fully shared ranks show nothing.

Example::

    r = NotebookRenderer([0, 1], hold=0)
    r.update(0, RankOutput(stdout="epoch 3\\n"))
    r.update(1, RankOutput(stdout="epoch 3\\n"))
    r.finish()
    r.shown()[0]["text/plain"]   # "[ranks 0-1]\\nepoch 3"
"""

from __future__ import annotations

import html
import time
from collections import deque
from typing import Any, cast

from clusterkernel.client.errors import _ANSI, rank_label
from clusterkernel.client.output._entries import RankEntries, Sharing
from clusterkernel.client.output._rank_output import RankOutput, plain_text

_STYLE = (
    "<style>.ck-rank{margin:2px 0;border-left:3px solid #7a9cc6;padding-left:6px}"
    ".ck-rank b{font-family:monospace;color:#335}"
    ".ck-rank pre{margin:0;white-space:pre-wrap}"
    # a rank's stderr as JupyterLab shows a kernel's (its theme's stderr background)
    ".ck-err{background:var(--jp-rendermime-error-background,#fdd)}</style>"
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
    # plain text as a kernel's text/plain shows it: obj? / %pinfo pages from the ranks
    # come coloured with ANSI codes, which HTML would show as "[31mType:[39m"
    return f"<pre>{html.escape(_ANSI.sub('', data.get('text/plain', '')))}</pre>"


class NotebookRenderer:
    """A shared area for the messages ranks share, then one area per rank, updated in place.

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
    hold = 0.2  # seconds a message only one rank has printed waits before it shows

    def __init__(self, ranks: list[int], hold: float | None = None) -> None:
        self.ranks = list(ranks)
        if hold is not None:
            self.hold = hold
        self._areas: list[int | None] = [None, *self.ranks]  # None: the shared area
        self._handles: dict[int | None, Any] = {}  # area -> its DisplayHandle or None
        self._bundles: dict[int | None, dict] = {}
        self._last: dict[int | None, float] = {}
        self._dirty: set[int | None] = set()
        self._keys: dict[int, tuple] = {}
        self._entries = {r: RankEntries() for r in self.ranks}
        self._sharing = Sharing()
        self._young: deque[tuple[float, int]] = deque()
        self._final = False

    # ------------------------------------------------------------ rendering
    def _html_items(self, rank: int, indices: list[int]) -> list[str]:
        entries = self._entries[rank]
        parts: list[str] = []
        run: list[str] = []
        run_kind = None
        for i in [*indices, -1]:
            kind = entries.kinds[i] if i >= 0 else ""
            if run and kind != run_kind:
                cls = " class='ck-err'" if run_kind == "stderr" else ""
                text = html.escape(_ANSI.sub("", "\n".join(run)))
                parts.append(f"<pre{cls}>{text}</pre>")
                run = []
            if kind in ("stdout", "stderr"):
                run.append(entries.keys[i])
                run_kind = kind
            elif kind == "output":  # outputs and results have their content; text has None
                parts.append(_rich_html(cast(dict, entries.contents[i])))
            elif kind == "result":
                parts.append(f"<div>Out: {_rich_html(cast(dict, entries.contents[i]))}</div>")
        return parts

    def _text_items(self, rank: int, label: str, indices: list[int]) -> list[str]:
        entries = self._entries[rank]
        out = []
        for i in indices:
            kind = entries.kinds[i]
            if kind in ("stdout", "stderr"):
                out.append(entries.keys[i])
            elif kind == "output":
                out.append(plain_text(cast(dict, entries.contents[i])))
            else:
                out.append(f"Out[{label}]: {plain_text(cast(dict, entries.contents[i]))}")
        return out

    def _blocks(self, area: int | None, now: float) -> list[tuple[list[int], list[int]]]:
        """``(ranks, [entry index, ...])`` blocks an area shows, in order."""
        if area is not None:
            entries = self._entries[area]
            first = self._sharing.prefix.get(area, 0)
            if first >= len(entries):
                return []
            if not self._final and now - entries.born[first] < self.hold:
                return []  # the others may still print it: wait, and keep the order
            return [([area], list(range(first, len(entries))))]
        blocks: list[tuple[list[int], list[int]]] = []
        for i, groups in enumerate(self._sharing.groups):
            for ranks in groups:
                if blocks and blocks[-1][0] == ranks:
                    blocks[-1][1].append(i)
                else:
                    blocks.append((ranks, [i]))
        return blocks

    def _bundle(self, area: int | None, now: float) -> dict:
        html_parts: list[str] = []
        text_parts: list[str] = []
        for ranks, indices in self._blocks(area, now):
            label = rank_label(ranks)
            html_parts.append(f"<div class='ck-rank'><b>[{label}]</b>")
            html_parts += self._html_items(ranks[0], indices)
            html_parts.append("</div>")
            text_parts += [f"[{label}]", *self._text_items(ranks[0], label, indices)]
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
            entries = self._entries[rank]
            before = len(entries)
            entries.ingest(out, now)
            if len(entries) > before:
                self._young.append((now, rank))  # its area may show them once the hold passes
            self._dirty.add(rank)
            old = dict(self._sharing.prefix)
            if self._sharing.update(self._entries) is not None:
                self._dirty.add(None)
                self._dirty.update(r for r in self.ranks if old.get(r) != self._sharing.prefix[r])
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
