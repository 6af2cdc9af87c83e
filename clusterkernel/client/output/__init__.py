"""Show each rank's output while a cell runs (client side).

Two renderers share one small interface (:class:`Renderer`: ``update(rank,
RankOutput)``, ``notice(text)``, ``finish()``). Both show a line that several ranks
printed identically once, named with its ranks (``[ranks 0-15] epoch 3 loss 0.41``),
and keep lines that differ apart, so 16 or 32 ranks stay readable.

- :class:`TerminalRenderer` (``_terminal_renderer``) prints complete lines,
  prefixed ``[rank N]``, gathered for a short hold and grouped by
  :func:`group_lines`;
- :class:`NotebookRenderer` (``_notebook_renderer``) shows a shared area, then
  one area per rank, all updated in place.

Each module's docstring gives the exact order and grouping. :func:`default_renderer`
picks the one that suits the running shell.

Example::

    from clusterkernel.client.output import RankOutput, default_renderer
    r = default_renderer([0, 1])
    r.update(0, RankOutput(stdout="hi\\n"))
    r.finish()
"""

from __future__ import annotations

from clusterkernel.client.output._notebook_renderer import NotebookRenderer
from clusterkernel.client.output._rank_output import RankOutput, Renderer
from clusterkernel.client.output._terminal_renderer import TerminalRenderer, group_lines

__all__ = [
    "NotebookRenderer",
    "RankOutput",
    "Renderer",
    "TerminalRenderer",
    "default_renderer",
    "group_lines",
    "in_notebook",
]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (display areas can be updated in place)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def default_renderer(ranks: list[int]) -> Renderer:
    """A :class:`NotebookRenderer` inside a Jupyter kernel, else a :class:`TerminalRenderer`."""
    return NotebookRenderer(ranks) if in_notebook() else TerminalRenderer(ranks)
