"""Each rank's colour, the same in the live panels and the saved PNG (client side).

Its own module so that the export (``_export``) draws with the panels' colours without
importing the panels (``_views``), which show the profile panel, whose profile exports
with the dashboard's trace.

Example::

    rank_color(0), rank_color(10)    # '#1f77b4' twice: ten colours, then round again
"""

from __future__ import annotations

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def rank_color(rank: int) -> str:
    """Rank ``rank``'s colour (one of :data:`PALETTE`, by rank)."""
    return PALETTE[rank % len(PALETTE)]
