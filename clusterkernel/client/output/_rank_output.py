"""What a rank printed in a cell, and what a renderer does with it (client side).

:class:`RankOutput` is one rank's output so far in the running cell; a
:class:`Renderer` shows it. The two renderers (``_terminal_renderer``,
``_notebook_renderer``) and :mod:`clusterkernel.client.output`, which picks one, build on this.

Example::

    out = RankOutput(stdout="epoch 1\\n")
    renderer.update(0, out)      # any Renderer: terminal or notebook
    renderer.finish()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
    """Shows the ranks' output: ``update`` as it grows, ``notice`` between, ``finish`` at the end."""

    def update(self, rank: int, out: RankOutput) -> None: ...
    def notice(self, text: str) -> None: ...
    def finish(self) -> None: ...


def plain_text(content: dict) -> str:
    """The ``text/plain`` of a display_data or execute_result content ("" if none)."""
    return content.get("data", {}).get("text/plain", "")
