"""A line and bar plot that the browser draws on a canvas: the dashboard's live panels.

Why not SVG (bqplot, which the dashboard used first): with the browser on the same
cores as the ranks, drawing is what the dashboard costs the training. bqplot's loss
panel alone took a large share of a core at 5 pictures a second, and a canvas redraw
of the same points a small fraction of that (``benchmarks/bench_dashboard_draw.py``;
BENCHMARKS.md, "Where the browser's time goes").

The kernel side is only data: axis ranges set by the caller, and all series' points
as one float64 buffer (a binary frame on the widget comm, not JSON), sent in one
message per update. The drawing is ``_plot.js``, loaded by anywidget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import anywidget
import numpy as np
import traitlets as t


class Series(NamedTuple):
    """One line (``kind="line"``, NaN breaks it) or a set of bars (``"segments"``:
    points ``2i`` to ``2i+1``) in data coordinates."""

    x: np.ndarray
    y: np.ndarray
    color: str
    label: str = ""
    width: float = 1.5
    kind: str = "line"


class Plot(anywidget.AnyWidget):
    """Series drawn on a canvas in the browser, with axes, title and legend.

    Example::

        plot = Plot(title="loss", xlabel="step", ylabel="loss")
        plot.xlim, plot.ylim = [0, 10], [0, 1]
        plot.draw([Series(np.arange(10.0), np.linspace(1, 0, 10), "#1f77b4", "rank 0")])
        plot  # in a notebook
    """

    _esm = Path(__file__).with_name("_plot.js")
    title = t.Unicode("").tag(sync=True)
    xlabel = t.Unicode("").tag(sync=True)
    ylabel = t.Unicode("").tag(sync=True)
    xlim = t.List(t.Float(), [0.0, 1.0]).tag(sync=True)
    ylim = t.List(t.Float(), [0.0, 1.0]).tag(sync=True)
    yticks = t.List(t.Float(), []).tag(sync=True)  # empty: chosen from the range
    ytick_format = t.Unicode("").tag(sync=True)  # "d": whole numbers
    height = t.Int(260).tag(sync=True)
    series = t.List(t.Dict(), []).tag(sync=True)
    data = t.Bytes(b"").tag(sync=True)

    def draw(self, series: list[Series]) -> int:
        """Replace what is drawn with ``series``; return the number of points sent."""
        meta: list[dict[str, Any]] = []
        cols = []
        for s in series:
            x = np.asarray(s.x, dtype=np.float64).ravel()
            y = np.asarray(s.y, dtype=np.float64).ravel()
            if len(x) != len(y):
                raise ValueError(f"series {s.label!r}: {len(x)} x values but {len(y)} y values")
            meta.append(
                {"n": len(x), "color": s.color, "label": s.label, "width": s.width, "kind": s.kind}
            )
            cols += [x, y]
        with self.hold_sync():
            self.series = meta
            self.data = np.concatenate(cols).tobytes() if cols else b""
        return sum(m["n"] for m in meta)

    def drawn(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{label: (x, y)}`` as the browser has it (series without a label: ``"#i"``)."""
        data, out, at = np.frombuffer(self.data, dtype=np.float64), {}, 0
        for i, m in enumerate(self.series):
            n = m["n"]
            out[m["label"] or f"#{i}"] = (data[at : at + n], data[at + n : at + 2 * n])
            at += 2 * n
        return out
