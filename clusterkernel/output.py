"""Show each rank's output while a cell runs (client side).

Two renderers share one small interface (``update(rank, RankOutput)``,
``notice(text)``, ``finish()``):

- :class:`NotebookRenderer`: one display area per rank, created in rank order,
  each updated in place as that rank prints, so rank order and live streaming
  hold together. Rich output (figures, HTML) lands inside its rank's area.
- :class:`TerminalRenderer`: lines are printed as they arrive with a
  ``[rank N]`` prefix.

:func:`default_renderer` picks the one that suits the running shell.
"""

from __future__ import annotations

import html
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

from clusterkernel.errors import _ANSI


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


class TerminalRenderer:
    """Prefix each complete line with its rank and print it as it arrives."""

    def __init__(self, ranks: list[int], stream=None) -> None:
        self.ranks = ranks
        self.stream = stream
        self._seen: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}
        self._shown_outputs: dict[int, int] = {}
        self._shown_result: set[int] = set()

    def _out(self):
        return self.stream or sys.stdout

    def _emit(self, rank: int, name: str, text: str, final: bool = False) -> None:
        key = (rank, name)
        new = text[self._seen.get(key, 0) :]
        self._seen[key] = len(text)
        buf = self._partial.get(key, "") + new
        lines = buf.split("\n")
        self._partial[key] = "" if final else lines.pop()
        if final and lines and lines[-1] == "":
            lines.pop()
        label = f"[rank {rank}]" if name == "stdout" else f"[rank {rank} stderr]"
        for line in lines:
            print(f"{label} {line}", file=self._out())

    def update(self, rank: int, out: RankOutput) -> None:
        self._emit(rank, "stdout", out.stdout)
        self._emit(rank, "stderr", out.stderr)
        for content in out.outputs[self._shown_outputs.get(rank, 0) :]:
            text = content.get("data", {}).get("text/plain", "<rich output>")
            print(f"[rank {rank} output] {text}", file=self._out())
        self._shown_outputs[rank] = len(out.outputs)
        if out.execute_result and rank not in self._shown_result:
            self._shown_result.add(rank)
            text = out.execute_result.get("data", {}).get("text/plain", "")
            print(f"Out[rank {rank}]: {text}", file=self._out())

    def notice(self, text: str) -> None:
        print(text, file=self._out())

    def finish(self) -> None:
        for (rank, name), rest in list(self._partial.items()):
            if rest:
                label = f"[rank {rank}]" if name == "stdout" else f"[rank {rank} stderr]"
                print(f"{label} {rest}", file=self._out())
        self._partial.clear()
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


class NotebookRenderer:
    """One display area per rank, in rank order, updated in place (throttled)."""

    min_interval = 0.1  # seconds between updates of one area

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks
        self._handles: dict[int, object] = {}
        self._state: dict[int, RankOutput] = {}
        self._drawn: dict[int, tuple] = {}
        self._last: dict[int, float] = {}

    def _ensure_areas(self) -> None:
        if self._handles:
            return
        from IPython.display import display

        # All areas at once, in rank order, the first time any rank has output;
        # empty areas render as nothing, so a quiet cell shows nothing at all.
        for rank in self.ranks:
            self._handles[rank] = display({"text/plain": ""}, raw=True, display_id=True)

    def _bundle(self, rank: int, out: RankOutput) -> dict:
        parts = [f"<div class='ck-rank'><b>[rank {rank}]</b>"]
        text_parts = [f"[rank {rank}]"]
        if out.stdout:
            parts.append(f"<pre>{html.escape(_ANSI.sub('', out.stdout))}</pre>")
            text_parts.append(out.stdout.rstrip("\n"))
        if out.stderr:
            parts.append(f"<pre class='ck-err'>{html.escape(_ANSI.sub('', out.stderr))}</pre>")
            text_parts.append(out.stderr.rstrip("\n"))
        for content in out.outputs:
            parts.append(_rich_html(content))
            text_parts.append(content.get("data", {}).get("text/plain", ""))
        if out.execute_result:
            data = out.execute_result.get("data", {})
            parts.append(f"<div>Out: {_rich_html(out.execute_result)}</div>")
            text_parts.append(f"Out[rank {rank}]: {data.get('text/plain', '')}")
        parts.append("</div>")
        return {"text/html": _STYLE + "".join(parts), "text/plain": "\n".join(text_parts)}

    def _draw(self, rank: int, force: bool) -> None:
        out = self._state.get(rank)
        if out is None or self._drawn.get(rank) == out.key():
            return
        now = time.monotonic()
        if not force and now - self._last.get(rank, 0.0) < self.min_interval:
            return
        self._ensure_areas()
        self._handles[rank].update(self._bundle(rank, out), raw=True)
        self._drawn[rank] = out.key()
        self._last[rank] = now

    def update(self, rank: int, out: RankOutput) -> None:
        if not (out.stdout or out.stderr or out.outputs or out.execute_result):
            return
        self._state[rank] = out
        self._draw(rank, force=False)

    def notice(self, text: str) -> None:
        from IPython.display import display

        display({"text/plain": text}, raw=True)

    def finish(self) -> None:
        for rank in self.ranks:
            self._draw(rank, force=True)
