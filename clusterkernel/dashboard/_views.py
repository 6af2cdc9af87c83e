"""The dashboard's panels: ipywidgets + bqplot, each drawn from a :class:`MetricsStore`.

bqplot rather than matplotlib for the live view: a redraw sends only the changed
arrays (binary buffers) over the widget comm, the browser draws them, and nothing
waits on the kernel's main thread, so updates arrive while a ``%%mpi`` cell blocks
it. (A matplotlib PNG per update costs ~20 ms of kernel time; ipympl stops drawing
while the cell blocks.) Matplotlib stays for the static PNG export.

Every panel has ``.widget`` and ``.update(store, ...)``; only the dashboard's
drawing thread calls ``update``.
"""

from __future__ import annotations

import html

import bqplot as bq
import ipywidgets as w
import numpy as np

from clusterkernel.dashboard._store import MetricsStore
from clusterkernel.dashboard._thin import thin

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def rank_color(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


def _figure(title: str, marks, axes, css: str, height: str = "260px") -> bq.Figure:
    fig = bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        animation_duration=0,
        fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
        layout=w.Layout(width="100%", height=height),
    )
    fig.add_class(css)
    return fig


class ScalarPanel:
    """One logged scalar against step, one line per rank (the loss panel, throughput).

    All ranks' lines are one bqplot mark (rows of a 2-D array, shorter rows padded
    with NaN, which bqplot leaves undrawn): the browser's cost is per mark updated,
    not per point (measured in benchmarks/bench_dashboard.py --part draw), so one
    update per picture instead of one per rank.
    """

    def __init__(self, metric: str, title: str, css: str, max_points: int = 1000) -> None:
        self.metric = metric
        self.max_points = max_points
        self._sx, self._sy = bq.LinearScale(), bq.LinearScale()
        self._mark = bq.Lines(
            x=np.zeros(0),
            y=np.zeros(0),
            scales={"x": self._sx, "y": self._sy},
            colors=[rank_color(0)],
            display_legend=True,
        )
        self._ranks: list[int] = []  # the mark's rows
        self._shown: dict[int, int] = {}  # rank -> points drawn (the rest of its row: NaN)
        self._drawn: dict[int, int] = {}  # rank -> series length when last drawn
        self._extent: dict[int, tuple] = {}  # rank -> x min, x max, y min, y max drawn
        axes = [
            bq.Axis(scale=self._sx, label="step"),
            bq.Axis(scale=self._sy, side="left", label=metric, tick_format=".3g"),
        ]
        self.figure = _figure(title, [self._mark], axes, css)
        self.widget: w.Widget = self.figure

    def line(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` drawn for ``rank`` (thinned), as the browser has it."""
        row, n = self._ranks.index(rank), self._shown[rank]
        x, y = np.atleast_2d(self._mark.x), np.atleast_2d(self._mark.y)
        return x[row, :n], y[row, :n]

    def set_metric(self, metric: str) -> None:
        self.metric = metric
        self.figure.axes[1].label = metric
        self._drawn.clear()
        self._extent.clear()
        self._sx.min = self._sx.max = self._sy.min = self._sy.max = None

    def update(self, store: MetricsStore) -> int:
        """Redraw if any rank's data grew; return how many points were sent."""
        series = {r: xy for r, xy in store.series(self.metric).items() if len(xy[0])}
        lengths = {r: len(x) for r, (x, _) in series.items()}
        if lengths == self._drawn:
            return 0  # unchanged: send nothing
        self._drawn = lengths
        lines = {r: thin(x, y, self.max_points) for r, (x, y) in series.items()}
        ranks = sorted(lines)
        width = max((len(x) for x, _ in lines.values()), default=0)
        xs, ys = np.full((len(ranks), width), np.nan), np.full((len(ranks), width), np.nan)
        self._extent.clear()
        for row, rank in enumerate(ranks):
            x, y = lines[rank]
            xs[row, : len(x)], ys[row, : len(y)] = x, y
            finite = y[np.isfinite(y)]
            if len(finite):
                self._extent[rank] = (x[0], x[-1], finite.min(), finite.max())
        self._shown = {r: len(lines[r][0]) for r in ranks}
        with self._mark.hold_sync():
            if ranks != self._ranks:
                self._mark.colors = [rank_color(r) for r in ranks] or [rank_color(0)]
                self._mark.labels = [f"rank {r}" for r in ranks]
            self._ranks = ranks
            self._mark.x, self._mark.y = (xs, ys) if ranks else (np.zeros(0), np.zeros(0))
        self._fit()
        return int(xs.size)

    def _fit(self) -> None:
        """Set the axes' ranges only when the data leaves them, with room to grow.

        With bqplot's automatic ranges every redraw also moves both axes, so the
        browser redraws ticks and labels too. Here the step axis grows by half again
        when reached and the value axis by a tenth of its span, so most redraws move
        the lines only.
        """
        if not self._extent:
            return
        ext = np.array(list(self._extent.values()))
        x0, x1, y0, y1 = ext[:, 0].min(), ext[:, 1].max(), ext[:, 2].min(), ext[:, 3].max()
        sx, sy = self._sx, self._sy
        if sx.min is None or x0 < sx.min or x1 > sx.max:
            sx.min, sx.max = float(x0), float(x0 + max(1.5 * (x1 - x0), 10.0))
        if sy.min is None or y0 < sy.min or y1 > sy.max:
            pad = 0.1 * ((y1 - y0) or abs(y1) or 1.0)
            sy.min, sy.max = float(y0 - pad), float(y1 + pad)


class LossPanel(ScalarPanel):
    """Loss (or any logged scalar, chosen in the drop-down) against step per rank."""

    def __init__(self, metric: str = "loss", max_points: int = 1000) -> None:
        super().__init__(metric, "loss per rank", "ck-loss", max_points)
        self.choice = w.Dropdown(options=[metric], value=metric, description="metric")
        self.choice.observe(lambda ch: self.set_metric(ch["new"]), names="value")
        self.widget = w.VBox([self.choice, self.figure])

    def update(self, store: MetricsStore) -> int:
        names = store.scalar_names()
        if names and tuple(names) != tuple(self.choice.options):
            keep = self.choice.value
            self.choice.options = names
            self.choice.value = keep if keep in names else names[0]
        return super().update(store)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class CommPanel:
    """Time in each communication op per rank: a table with bars (count, bytes, wait).

    Plain HTML: a table is what this panel is; the bar in each row is the op's
    share of the busiest row, so the slow op and the rank that waits stand out.
    """

    def __init__(self) -> None:
        self.widget = w.HTML("<div class='ck-comm'><i>no communication yet</i></div>")
        self._last: list | None = None

    def update(self, store: MetricsStore) -> None:
        rows = store.comm_table()
        if rows == self._last or not rows:
            return
        self._last = rows
        top = max(r["seconds"] for r in rows) or 1.0
        head = "".join(
            f"<th>{h}</th>"
            for h in ("rank", "op", "count", "bytes", "total s", "wait s", "mean ms", "")
        )
        body = "".join(
            f"<tr><td>{r['rank']}</td><td>{html.escape(str(r['op']))}</td><td>{r['count']}</td>"
            f"<td>{_bytes(r['nbytes'])}</td><td>{r['seconds']:.4f}</td><td>{r['wait_s']:.4f}</td>"
            f"<td>{1e3 * r['seconds'] / max(r['count'], 1):.3f}</td>"
            f"<td style='width:120px;text-align:left'><div style='background:{rank_color(r['rank'])};"
            f"height:9px;width:{100 * r['seconds'] / top:.1f}%'></div></td></tr>"
            for r in rows
        )
        self.widget.value = (
            "<div class='ck-comm'><b>time per communication op</b>"
            "<table class='ck-table ck-comm-table'><tr>" + head + "</tr>" + body + "</table></div>"
        )


class TimelinePanel:
    """Compute and comm per rank over the last ``window`` seconds, live.

    The Horovod timeline's view at a glance: the window is cut into ``columns``
    time slots (about a pixel each); per rank, a comm op's bar covers the slots
    where that op was in flight at least half the time (above the rank's axis),
    and "compute" covers the slots where the rank was not blocked in a comm call
    (below). Named ``metrics.span`` blocks get their own bars below too. Drawing
    costs the same however many calls a rank makes; the exact intervals are in
    the store and in the Chrome-trace export.
    """

    columns = 400

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._sx = bq.LinearScale(min=-window, max=0.0)
        self._sy = bq.LinearScale(min=-0.6, max=0.6)
        self._marks: dict[str, bq.Lines] = {}
        axes = [
            bq.Axis(scale=self._sx, label="seconds ago"),
            bq.Axis(scale=self._sy, side="left", label="rank", tick_format="d"),
        ]
        self.figure = _figure(
            f"timeline (last {window:g} s): comm above, compute below",
            [],
            axes,
            "ck-timeline",
            height="220px",
        )
        self.legend = w.HTML()
        self.widget = w.VBox([self.figure, self.legend])
        self._shown: set[str] = set()

    def _mark(self, name: str) -> bq.Lines:
        mark = self._marks.get(name)
        if mark is None:
            color = PALETTE[len(self._marks) % len(PALETTE)]
            mark = bq.Lines(
                x=np.zeros((1, 2)),
                y=np.zeros((1, 2)),
                scales={"x": self._sx, "y": self._sy},
                colors=[color],
                stroke_width=9,
                visible=False,
            )
            self._marks[name] = mark
            self.figure.marks = list(self._marks.values())
            self.legend.value = " ".join(
                f"<span style='color:{m.colors[0]}'>&#9632;</span> {html.escape(n)}"
                for n, m in self._marks.items()
            )
        return mark

    def update(self, store: MetricsStore, ranks: list[int]) -> None:
        if ranks and self._sy.max != max(ranks) + 0.6:
            self._sy.min, self._sy.max = -0.6, max(ranks) + 0.6
            self.figure.axes[1].tick_values = np.array(ranks, dtype=float)
        slot = self.window / self.columns
        edges = np.linspace(-self.window, 0.0, self.columns + 1)
        segs: dict[str, list] = {}
        busy: dict[int, np.ndarray] = {}  # rank -> slots with any activity
        blocked: dict[int, np.ndarray] = {}
        for (rank, kind, name), (start, end) in store.timeline_arrays(self.window).items():
            occ = _occupancy(start, end, -self.window, slot, self.columns)
            busy[rank] = np.maximum(busy.get(rank, 0), occ > 0)
            if kind == "blocked":
                blocked[rank] = occ
                continue
            lane, key = (rank + 0.18, name) if kind == "comm" else (rank - 0.18, f"{name} (span)")
            segs.setdefault(key, []).extend(
                (edges[a], edges[b], lane) for a, b in _runs(occ >= 0.5)
            )
        for rank, active in busy.items():
            # active: within a second of any recorded interval; compute: active, not blocked
            near = np.convolve(active.astype(float), np.ones(int(1 / slot) * 2 + 1), "same") > 0
            idle_block = blocked.get(rank, np.zeros(self.columns))
            runs = _runs(near & (idle_block < 0.5))
            segs.setdefault("compute", []).extend(
                (edges[a], edges[b], rank - 0.18) for a, b in runs
            )
        drawn = set()
        for name, items in segs.items():
            if not items:
                continue
            arr = np.array(items)
            mark = self._mark(name)
            with mark.hold_sync():
                mark.x = arr[:, :2]
                mark.y = np.repeat(arr[:, 2:3], 2, axis=1)
                mark.visible = True
            drawn.add(name)
        for name in self._shown - drawn:
            self._marks[name].visible = False
        self._shown = drawn


def _occupancy(start: np.ndarray, end: np.ndarray, t0: float, slot: float, n: int) -> np.ndarray:
    """Fraction of each of ``n`` slots of width ``slot`` from ``t0`` covered by intervals."""
    start = np.clip(start, t0, t0 + n * slot)
    end = np.clip(end, t0, t0 + n * slot)
    occ = np.zeros(n)
    first = np.minimum(((start - t0) // slot).astype(int), n - 1)
    last = np.minimum(((end - t0) // slot).astype(int), n - 1)
    short = first == last  # most calls: inside one slot
    np.add.at(occ, first[short], (end - start)[short])
    for s, e, a, b in zip(start[~short], end[~short], first[~short], last[~short]):
        occ[a] += t0 + (a + 1) * slot - s
        occ[a + 1 : b] += slot
        occ[b] += e - (t0 + b * slot)
    return np.minimum(occ / slot, 1.0)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` index ranges where ``mask`` is true."""
    padded = np.concatenate([[False], mask, [False]]).astype(int)
    change = np.flatnonzero(np.diff(padded))
    return list(zip(change[::2], change[1::2]))


class StatusPanel:
    """Cluster status per rank: host, pid, state, CPU, memory, stream health."""

    def __init__(self) -> None:
        self.widget = w.HTML()
        self._last = ""

    def update(self, store: MetricsStore, states: dict[int, dict]) -> None:
        stream = store.status()
        ranks = sorted(set(states) | set(stream))
        head = "".join(
            f"<th>{h}</th>"
            for h in ("rank", "host", "pid", "state", "CPU %", "mem MiB", "records", "last msg")
        )
        rows = []
        for r in ranks:
            s, st = stream.get(r, {}), states.get(r, {})
            cpu, mem = s.get("cpu", st.get("cpu")), s.get("rss_mib", st.get("memory_mib"))
            n = sum(s.get("records", {}).values()) if s else 0
            age = f"{s['age_s']:.1f} s ago" if s else "never"
            warn = ""
            if s.get("lost") or s.get("gaps"):
                warn = (
                    f" <b style='color:#c00'>lost {s.get('lost', 0)} / gaps {s.get('gaps', 0)}</b>"
                )
            rows.append(
                f"<tr><td>{r}</td><td>{html.escape(str(s.get('host', st.get('host', '?'))))}</td>"
                f"<td>{s.get('pid', st.get('pid', '?'))}</td><td>{st.get('state', '?')}</td>"
                f"<td>{'-' if cpu is None else f'{cpu:.0f}'}</td>"
                f"<td>{'-' if mem is None else f'{mem:.0f}'}</td><td>{n}{warn}</td><td>{age}</td></tr>"
            )
        value = (
            "<table class='ck-table ck-status'><tr>" + head + "</tr>" + "".join(rows) + "</table>"
        )
        if value != self._last:
            self.widget.value = value
            self._last = value


_CSS = (
    "<style>.ck-table{border-collapse:collapse;font-size:12px;margin:4px 0}"
    ".ck-table td,.ck-table th{border:1px solid #ddd;padding:2px 6px;text-align:right}"
    ".ck-head{font-family:monospace;font-size:12px}</style>"
)


class DashboardView:
    """All panels in one widget: loss and throughput, timeline, comm, status."""

    def __init__(self, metric: str = "loss", window: float = 10.0, max_points: int = 1000):
        self.loss = LossPanel(metric, max_points)
        self.throughput = ScalarPanel(
            "samples_per_s", "throughput (samples/s) per rank", "ck-throughput", max_points
        )
        self.timeline = TimelinePanel(window)
        self.comm = CommPanel()
        self.status = StatusPanel()
        self.header = w.HTML(_CSS + "<div class='ck-head'>waiting for the ranks...</div>")
        self.widget = w.VBox(
            [
                self.header,
                w.HBox(
                    [self.loss.widget, self.throughput.widget],
                    layout=w.Layout(width="100%"),
                ),
                self.timeline.widget,
                w.HBox([self.comm.widget, self.status.widget], layout=w.Layout(width="100%")),
            ],
            layout=w.Layout(width="100%"),
        )
        self.loss.widget.layout.width = self.throughput.widget.layout.width = "50%"
        self.comm.widget.layout.width = self.status.widget.layout.width = "50%"
        self.widget.add_class("ck-dashboard")

    def set_header(self, text: str) -> None:
        self.header.value = _CSS + f"<div class='ck-head'>{html.escape(text)}</div>"
