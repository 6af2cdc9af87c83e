"""The dashboard's panels: ipywidgets and canvas plots, each drawn from a :class:`MetricsStore`.

The plots (:class:`~clusterkernel.client.dashboard._plot.Plot`) send only data over the
widget comm (binary buffers) and the browser draws them on a canvas, so nothing
waits on the kernel's main thread and updates arrive while a ``%%mpi`` cell blocks
it. (A matplotlib PNG per update costs the kernel's time; ipympl stops drawing while
the cell blocks; bqplot's SVG cost the browser more per picture: BENCHMARKS.md,
"Dashboard".)
Matplotlib stays for the static PNG export.

Every panel has ``.widget`` and ``.update(store, ...)``; only the dashboard's
drawing thread calls ``update``.
"""

from __future__ import annotations

import html
import time

import ipywidgets as w
import numpy as np

from clusterkernel.client.dashboard._colors import PALETTE, rank_color
from clusterkernel.client.dashboard._plot import Plot, Series
from clusterkernel.client.dashboard._profile_view import ProfilePanel
from clusterkernel.client.dashboard._store import MetricsStore, blocked_differs
from clusterkernel.client.dashboard._thin import thin

EARLIER_RUNS = 3  # earlier runs drawn faint behind the current one
FAINT = "4d"  # their colour's alpha (hex): 30 %


class ScalarPanel:
    """One logged scalar against step, one line per rank (the loss panel, throughput).

    Each run (an execution of a cell that logged, see :meth:`MetricsStore.runs`) has
    lines of its own: the newest run that logged this scalar is drawn in full colour
    and sets the axes, the few runs before it faint behind it, never joined to it.
    An update sends every line in one message, and only when a line grew or the run
    changed.
    """

    def __init__(self, metric: str, title: str, css: str, max_points: int = 1000) -> None:
        self.metric = metric
        self.title = title
        self.max_points = max_points
        self.plot = Plot(title=title, xlabel="step", ylabel=metric, layout=w.Layout(width="100%"))
        self.plot.add_class(css)
        self._drawn: tuple = ()  # what was last sent: run, earlier runs, line lengths
        self._faint: tuple[tuple, list[Series]] = ((), [])  # earlier runs' lines, kept
        self._fitted = False  # axis ranges set for the current metric and run
        self.run: int | None = None  # the run drawn in full colour
        self.widget: w.Widget = self.plot

    def line(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` drawn for ``rank`` in the current run (thinned), as the browser has it."""
        return self.plot.drawn()[f"rank {rank}"]

    def faint_lines(self) -> int:
        """How many lines of earlier runs are drawn."""
        return sum(1 for label in self.plot.drawn() if label.startswith("#"))

    def set_metric(self, metric: str) -> None:
        self.metric = metric
        self.plot.ylabel = metric
        self._drawn = ()
        self._faint = ((), [])
        self._fitted = False

    def update(self, store: MetricsStore) -> int:
        """Redraw if a line grew or a new run began; return how many points were sent."""
        run = store.current_run(self.metric)
        if run is None:  # nothing logged (or the store was cleared)
            if self._drawn:
                self._drawn, self._faint, self.run, self._fitted = (), ((), []), None, False
                self.plot.title = self.title
                self.plot.draw([])
            return 0
        earlier = tuple(
            r["run"] for r in store.runs() if self.metric in r["scalars"] and r["run"] < run
        )[-EARLIER_RUNS:]
        series = {r: xy for r, xy in store.series(self.metric, run).items() if len(xy[0])}
        drawn = (run, earlier, tuple((r, len(x)) for r, (x, _) in sorted(series.items())))
        if drawn == self._drawn:
            return 0  # unchanged: send nothing
        self._drawn = drawn
        if run != self.run:
            self.run, self._fitted = run, False
            self.plot.title = f"{self.title}, {store.run_label(run)}"
        if self._faint[0] != earlier:  # earlier runs' lines are read once
            faint = []
            for old in earlier:
                for r, (x, y) in sorted(store.series(self.metric, old).items()):
                    x, y = thin(x, y, max(self.max_points // 4, 4))
                    faint.append(Series(x, y, rank_color(r) + FAINT, "", width=1.0))
            self._faint = (earlier, faint)
        lines = {r: thin(x, y, self.max_points) for r, (x, y) in sorted(series.items())}
        with self.plot.hold_sync():  # ranges and lines: one message
            self._fit(lines)
            return self.plot.draw(
                self._faint[1]
                + [Series(x, y, rank_color(r), f"rank {r}") for r, (x, y) in lines.items()]
            )

    def _fit(self, lines: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Fit the axes to the lines: the step axis from the first step drawn to the
        last, the value axis over the values with a tenth of their span beside them
        (set again only when a value leaves it, so it does not jump at every redraw).
        """
        ext = []
        for x, y in lines.values():
            finite = y[np.isfinite(y)]
            if len(finite):
                ext.append((x[0], x[-1], finite.min(), finite.max()))
        if not ext:
            return
        e = np.array(ext)
        x0, x1, y0, y1 = e[:, 0].min(), e[:, 1].max(), e[:, 2].min(), e[:, 3].max()
        (ax0, ax1), (ay0, ay1) = self.plot.xlim, self.plot.ylim
        if not self._fitted or x0 != ax0 or x1 != ax1:
            half = 0.0 if x1 > x0 else 0.5  # one step alone: a unit-wide axis around it
            self.plot.xlim = [float(x0) - half, float(x1) + half]
        if not self._fitted or y0 < ay0 or y1 > ay1:
            pad = 0.1 * ((y1 - y0) or abs(y1) or 1.0)
            self.plot.ylim = [float(y0 - pad), float(y1 + pad)]
        self._fitted = True


class LossPanel(ScalarPanel):
    """Loss (or any logged scalar, chosen in the drop-down) against step per rank."""

    def __init__(self, metric: str = "loss", max_points: int = 1000) -> None:
        super().__init__(metric, "loss per rank", "ck-loss", max_points)
        self.choice = w.Dropdown(
            options=[metric], value=metric, description="metric",
            style={"description_width": "initial"},
            layout=w.Layout(width="auto", max_width="100%"),
        )  # fmt: skip
        self.choice.observe(lambda ch: self.set_metric(ch["new"]), names="value")
        self.widget = w.VBox([self.choice, self.plot])

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
            # a no-break space: the number and its unit stay on one line
            return f"{n:.0f}\u00a0{unit}" if unit == "B" else f"{n:.1f}\u00a0{unit}"
        n /= 1024
    return f"{n:.1f}\u00a0GiB"


_COMM_HEAD = ("rank", "op", "count", "bytes", "total s", "blocked s", "mean ms")
# Why an algorithm ran, as the records of algorithm="auto" name it (comm._auto.adapt)
_WHY = (
    "why each algorithm ran: a plain name is the table's choice (or the one asked for); "
    "(probe): auto tried it beside its choice; (switch): auto moved to it, measured faster"
)


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"  # not measured: blank, never 0


class CommPanel:
    """Time in each communication op per rank in the current run (the newest run with
    comm calls): count, bytes, time (with a bar: the op's share of the busiest row, so
    the slow op and the rank that waits stand out); time blocked too where async calls
    made it differ (see :func:`blocked_differs`), blank where not measured.

    Plain HTML, sized for a narrow notebook (JupyterLab's file browser open): the
    algorithms an op ran with sit under its name, each with why where
    ``algorithm="auto"`` adapted (``ring (probe)``, ``shm (switch)``; a plain name is
    the table's choice or the one asked for), the bar behind its total.
    """

    def __init__(self) -> None:
        self.widget = w.HTML("<div class='ck-comm'><i>no communication yet</i></div>")
        self._last: tuple | None = None

    def update(self, store: MetricsStore) -> None:
        run = store.current_run(comm=True)
        rows = store.comm_table(run) if run is not None else []
        if (run, rows) == self._last:
            return
        self._last = (run, rows)
        if not rows:
            self.widget.value = "<div class='ck-comm'><i>no communication yet</i></div>"
            return
        top = max(r["seconds"] for r in rows) or 1.0
        blocked = blocked_differs(rows)
        head = "".join(f"<th>{h}</th>" for h in _COMM_HEAD if blocked or h != "blocked s")
        body = []
        for r in rows:
            algs = r["algorithms"]
            why = f" title='{_WHY}'" if any(a.endswith(")") for a in algs) else ""
            share = 100 * r["seconds"] / top
            bar = f"background:linear-gradient(90deg,{rank_color(r['rank'])}55 {share:.1f}%,transparent {share:.1f}%)"
            body.append(
                f"<tr><td>{r['rank']}</td><td class='ck-op'>{html.escape(str(r['op']))}"
                f"<div class='ck-alg'{why}>{html.escape(', '.join(algs))}</div></td>"
                f"<td>{r['count']}</td><td>{_bytes(r['nbytes'])}</td>"
                f"<td style='{bar}'>{r['seconds']:.4f}</td>"
                + (f"<td>{_secs(r['wait_s'])}</td>" if blocked else "")
                + f"<td>{1e3 * r['seconds'] / max(r['count'], 1):.3f}</td></tr>"
            )
        # Numbers never wrap ("12.3" over "ms" reads as two values); an op name may.
        # Should the panel still be too narrow, the table scrolls inside it rather
        # than spill over the status table.
        self.widget.value = (
            f"<div class='ck-comm' style='overflow-x:auto'><b>time per communication op, "
            f"{store.run_label(run) or 'the last cell that communicated'}</b>"
            "<table class='ck-table ck-comm-table'><tr>" + head + "</tr>" + "".join(body)
            + "</table></div>"
        )  # fmt: skip


QUIET_AFTER = 1.0  # s without a comm call or span: the timeline stops scrolling


class TimelinePanel:
    """Compute and comm per rank over the last ``window`` seconds, live; once the ranks
    record nothing for a second (the cell ended), the last window stays on show.

    The Horovod timeline's view at a glance: the window is cut into ``columns``
    time slots (about a pixel each); per rank, a comm op's bar covers the slots
    where that op was in flight at all, so every call shows however short (above
    the rank's axis), and "compute" covers the slots where the rank was not blocked
    in a comm call (below). Only the current run is drawn (the newest one, see
    :meth:`MetricsStore.runs`): the end of an earlier run stays out of its window. Named ``metrics.span`` blocks get their own bars below too. Rank 0
    is the top row, as in trace viewers: the rank axis runs downwards (``ylim``
    from high to low). Drawing costs the same however many calls a rank makes;
    the exact intervals are in the store and in the Chrome-trace export.
    """

    columns = 400

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self.plot = Plot(
            title=f"timeline (last {window:g} s): comm above, compute below",
            xlabel="seconds ago", ylabel="rank", xlim=[-window, 0.0], ylim=[0.6, -0.6],
            ytick_format="d", height=200, layout=w.Layout(width="100%"),
        )  # fmt: skip
        self.plot.add_class("ck-timeline")
        self.widget = self.plot
        self._colors: dict[str, str] = {}  # bar name -> colour, fixed once seen
        self._shown: set[str] = set()

    def _color(self, name: str) -> str:
        return self._colors.setdefault(name, PALETTE[len(self._colors) % len(PALETTE)])

    def bars(self, name: str) -> np.ndarray:
        """``[[start, end], ...]`` in seconds ago of ``name``'s bars, as drawn."""
        x, _ = self.plot.drawn()[name]
        return x.reshape(-1, 2)

    def update(self, store: MetricsStore, ranks: list[int]) -> None:
        # every rank seen so far labelled: the first records may come from some ranks only
        if ranks and list(self.plot.yticks) != [float(r) for r in ranks]:
            with self.plot.hold_sync():
                self.plot.ylim = [max(ranks) + 0.6, -0.6]  # high to low: rank 0 on top
                self.plot.yticks = [float(r) for r in ranks]
        slot = self.window / self.columns
        edges = np.linspace(-self.window, 0.0, self.columns + 1)
        segs: dict[str, list] = {}
        busy: dict[int, np.ndarray] = {}  # rank -> slots with any activity
        blocked: dict[int, np.ndarray] = {}
        now, live = time.time(), True
        latest = store.latest()
        if latest is not None and now - latest > QUIET_AFTER:
            # the ranks went quiet (the cell ended): keep showing their last window
            now, live = latest + QUIET_AFTER, False
        xlabel = "seconds ago" if live else "seconds before the ranks went quiet"
        if self.plot.xlabel != xlabel:
            self.plot.xlabel = xlabel
        run = store.current_run()  # earlier runs' intervals are not this run's picture
        since = store.run_span(run)[0] if run is not None else None
        arrays = store.timeline_arrays(self.window, now, since=since)
        for (rank, kind, name), (start, end) in arrays.items():
            occ = _occupancy(start, end, -self.window, slot, self.columns)
            busy[rank] = np.maximum(busy.get(rank, 0), occ > 0)
            if kind == "blocked":
                blocked[rank] = occ
                continue
            # the axis runs downwards: above a rank's row is a smaller value
            lane, key = (rank - 0.18, name) if kind == "comm" else (rank + 0.18, f"{name} (span)")
            # every call shows: a slot with any part of one is drawn (a 1 ms call in a
            # 25 ms slot is one slot wide), calls closer than a slot share a bar
            segs.setdefault(key, []).extend((edges[a], edges[b], lane) for a, b in _runs(occ > 0))
        for rank, active in busy.items():
            # active: within a second of any recorded interval; compute: active, not blocked
            near = np.convolve(active.astype(float), np.ones(int(1 / slot) * 2 + 1), "same") > 0
            idle_block = blocked.get(rank, np.zeros(self.columns))
            runs = _runs(near & (idle_block < 0.5))
            segs.setdefault("compute", []).extend(
                (edges[a], edges[b], rank + 0.18) for a, b in runs
            )
        series = []
        for name, items in segs.items():
            if items:
                arr = np.array(items)
                series.append(
                    Series(arr[:, :2], np.repeat(arr[:, 2:3], 2, axis=1), self._color(name),
                           name, width=9, kind="segments")
                )  # fmt: skip
        drawn = {s.label for s in series}
        if drawn or self._shown:
            self.plot.draw(series)
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
            for h in ("rank", "host / pid", "state", "CPU %", "MiB", "records", "last msg")
        )
        rows = []
        for r in ranks:
            s, st = stream.get(r, {}), states.get(r, {})
            cpu, mem = s.get("cpu", st.get("cpu")), s.get("rss_mib", st.get("memory_mib"))
            n = sum(s.get("records", {}).values()) if s else 0
            age = f"{s['age_s']:.1f} s" if s else "never"
            warn = ""
            if s.get("lost") or s.get("gaps"):
                warn = (
                    f" <b style='color:#c00'>lost {s.get('lost', 0)} / gaps {s.get('gaps', 0)}</b>"
                )
            rows.append(
                f"<tr><td>{r}</td><td class='ck-host'>"
                f"{html.escape(str(s.get('host', st.get('host', '?'))))}"
                f"<div class='ck-alg'>{s.get('pid', st.get('pid', '?'))}</div></td>"
                f"<td>{st.get('state', '?')}</td>"
                f"<td>{'-' if cpu is None else f'{cpu:.0f}'}</td>"
                f"<td>{'-' if mem is None else f'{mem:.0f}'}</td><td>{n}{warn}</td><td>{age}</td></tr>"
            )
        value = (
            "<table class='ck-table ck-status'><tr>" + head + "</tr>" + "".join(rows) + "</table>"
        )
        if value != self._last:
            self.widget.value = value
            self._last = value


# Sized for JupyterLab at 800 px with the file browser open (an output area of ~390
# px): cells hold numbers on one line, only names (op, host) may wrap, and the panels
# sit side by side only where both fit.
_CSS = (
    "<style>.ck-table{border-collapse:collapse;font-size:11px;margin:4px 0}"
    ".ck-table td,.ck-table th{border:1px solid #ddd;padding:2px 4px;text-align:right;"
    "white-space:nowrap}"
    ".ck-table td.ck-op,.ck-table td.ck-host{white-space:normal;overflow-wrap:anywhere;"
    "text-align:left;min-width:4em}"
    ".ck-alg{color:#777;font-size:10px}"
    ".ck-head{font-family:monospace;font-size:12px;overflow-wrap:anywhere}</style>"
)


def _flex(widget: w.Widget, basis: str) -> None:
    """Grow and shrink from ``basis`` in a wrapping row, never wider than the row."""
    widget.layout.flex = f"1 1 {basis}"
    widget.layout.min_width = "0"
    widget.layout.max_width = "100%"


class DashboardView:
    """All panels in one widget: loss and throughput, timeline, comm, status, and the
    profile of a profiled cell (``_profile_view``).

    Rows wrap: at a notebook's full width loss and throughput (and the two tables)
    sit side by side; in a narrow one (JupyterLab's file browser open) one above
    the other, nothing scrolling sideways.
    """

    def __init__(self, metric: str = "loss", window: float = 10.0, max_points: int = 1000):
        self.loss = LossPanel(metric, max_points)
        self.throughput = ScalarPanel(
            "samples_per_s", "throughput (samples/s) per rank", "ck-throughput", max_points
        )
        self.timeline = TimelinePanel(window)
        self.comm = CommPanel()
        self.status = StatusPanel()
        self.profile = ProfilePanel()
        # The stylesheet in a widget of its own, sent once: a <style> element
        # replaced with the header's text every update makes the browser restyle
        # the whole page each time.
        self.style = w.HTML(_CSS, layout=w.Layout(display="none"))
        self.header = w.HTML("<div class='ck-head'>waiting for the ranks...</div>")
        row = dict(width="100%", flex_flow="row wrap")
        self.widget = w.VBox(
            [
                self.style,
                self.header,
                w.HBox([self.loss.widget, self.throughput.widget], layout=w.Layout(**row)),
                self.timeline.widget,
                # side by side where both fit, one above the other where not: a table
                # never draws over its neighbour
                w.HBox([self.comm.widget, self.status.widget], layout=w.Layout(**row)),
                self.profile.widget,
            ],
            layout=w.Layout(width="100%", overflow="hidden"),
        )
        _flex(self.loss.widget, "340px")
        _flex(self.throughput.widget, "340px")
        for table in (self.comm.widget, self.status.widget):
            _flex(table, "360px")
            table.layout.overflow = "auto"
        self.widget.add_class("ck-dashboard")

    def set_header(self, text: str) -> None:
        self.header.value = f"<div class='ck-head'>{html.escape(text)}</div>"
