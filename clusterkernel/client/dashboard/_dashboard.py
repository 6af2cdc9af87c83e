"""``clusterkernel.Dashboard``: live per-rank metrics in the notebook (or terminal).

Three threads, none of them the notebook's main thread, which a running ``%%mpi``
cell keeps busy:

- on every rank, ``metrics.stream`` ships new records every 0.1 s;
- in the notebook, the :class:`Receiver` thread puts them in a :class:`MetricsStore`;
- the drawing thread here redraws the panels from the store at ``rate`` Hz,
  sending only what changed.

So the dashboard does not depend on :meth:`Cluster.run`'s wait loop at all; it
updates the same way for a blocking cell, a ``--noblock`` cell, or code that
logs between cells.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from clusterkernel.client import _session
from clusterkernel.client.dashboard import _export
from clusterkernel.client.dashboard._receiver import Receiver, lower_thread_priority
from clusterkernel.client.dashboard._store import MetricsStore
from clusterkernel.client.errors import ClusterError
from clusterkernel.protocol import _targets
from clusterkernel.protocol._rank_call import rank_call

TIMELINE_RATE = 1.0  # timeline redraws per second (it scrolls; faster is not readable)
SLOW_RATE = 0.5  # throughput, comm and status tables, header: every 2 s

if TYPE_CHECKING:
    from clusterkernel.client.dashboard._terminal import TerminalProgress
    from clusterkernel.client.dashboard._views import DashboardView


class Streamed(Protocol):
    """What a dashboard needs of the cluster whose ranks stream to it (a
    :class:`~clusterkernel.Cluster` is one). The cluster hands itself in; this package
    never imports the cluster's (the cluster imports it, for ``cluster.dashboard()``).

    Example::

        Dashboard(cluster)   # cluster: a running clusterkernel.Cluster
    """

    @property
    def running(self) -> bool: ...
    @property
    def lost(self) -> str | None: ...
    @property
    def multi_node(self) -> bool: ...
    @property
    def ranks(self) -> list[int]: ...
    def view(self) -> Any: ...
    def status(self) -> list[dict]: ...

    # the dashboard's port: it tells its cluster that the ranks stream to it, and that
    # it closes, and asks it for its receiver (started) and the address the ranks
    # stream to; the cluster tells it back only through ``ended`` (Cluster's docstring)
    def _dashboard_streaming(self, dash: Dashboard, ended: Callable[[bool], None]) -> None: ...
    def _dashboard_closed(self, dash: Dashboard) -> bool: ...
    def _dashboard_receiver(self, store: MetricsStore) -> tuple[Receiver, str]: ...


class Dashboard:
    """Live loss, communication timings, timeline, throughput and status of every rank.

    Parameters
    ----------
    cluster : the :class:`~clusterkernel.Cluster`; default: the one ``%mpi start`` started.
        The ranks stream to one dashboard: a new one becomes the cluster's
        (:meth:`Cluster.dashboard <clusterkernel.Cluster.dashboard>`) and an older
        one goes quiet, keeping its last picture.
    rate : redraws per second at most (the view skips a redraw when nothing changed).
    window : seconds of history in the timeline panel.
    metric : the scalar the loss panel shows first (any logged name can be picked).
    max_points : points per line drawn (the browser's cost grows with them: see
        ``benchmarks/bench_dashboard_draw.py``); the store keeps every point.
    interval : seconds between the ranks' batched sends.

    Each execution of a cell that records something is a **run** of its own: its lines
    start fresh, the runs before it stay faint behind it, and the step axis,
    throughput, comm table and timeline follow the newest run (:meth:`clear` starts
    empty). torch's DDP models report their gradient all-reduces by themselves.

    To keep it in view while a later cell trains: ``%%mpi --dashboard`` shows it
    under that cell, or in JupyterLab right-click the panels and pick "Create New
    View for Cell Output" (a side panel that stays while the notebook scrolls).

    Example (three notebook cells)::

        dash = clusterkernel.Dashboard()   # or cluster.dashboard(), %mpi dashboard
        dash                               # shows it; it updates while cells run

        %%mpi
        import clusterkernel
        for step in range(100):
            clusterkernel.log(step=step, loss=1 / (step + 1))

        dash.export("run1/")               # CSV, JSON, Chrome trace, PNG
    """

    def __init__(
        self,
        cluster: Streamed | None = None,
        *,
        rate: float = 5.0,
        window: float = 10.0,
        metric: str = "loss",
        max_points: int = 300,
        interval: float = 0.1,
    ) -> None:
        cluster = cluster if cluster is not None else _session.cluster()
        if cluster is None or not cluster.running:
            raise ClusterError(
                "No MPI ranks are running, so there is nothing to watch. Start them "
                "first with %mpi start -n 4 (or pass Dashboard(cluster=...))."
            )
        for name, value in (("rate", rate), ("window", window), ("interval", interval)):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if max_points < 4:
            raise ValueError(f"max_points must be at least 4, got {max_points!r}")
        self.cluster = cluster
        self.rate = float(rate)
        self.window = float(window)
        self.metric = metric
        self.max_points = int(max_points)
        self.interval = float(interval)
        self.store = MetricsStore()
        # the receiver, started, and the address the ranks stream to (a relay's from
        # outside the cluster)
        self.receiver: Receiver
        self._address: str
        self.receiver, self._address = cluster._dashboard_receiver(self.store)
        self.updates = 0  # redraws that sent something to the browser
        self.update_seconds = 0.0  # kernel time spent in them
        self.error: BaseException | None = None
        self.closed = False
        self._view: DashboardView | None = None
        self._terminal: TerminalProgress | None = None
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn_version = -1
        self._status_at = 0.0
        self._timeline_at = 0.0
        self._lock = threading.Lock()
        try:
            self.attach()
        except BaseException:
            self.receiver.stop()
            cluster._dashboard_closed(self)  # its relay, if it has one, goes too
            raise
        # The ranks now stream here, so this is the cluster's dashboard from now on
        # (what %mpi dashboard and %%mpi --dashboard show); an older one goes quiet.
        cluster._dashboard_streaming(self, self._streams_ended)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.store.ranks())} ranks streaming"
        return f"<clusterkernel.Dashboard {state}, {self.store.messages} messages>"

    # ------------------------------------------------------------------ ranks
    def attach(self) -> list[dict]:
        """Make every rank stream to this dashboard (again after ``%mpi restart``).

        Records logged before are sent too: nothing logged on a rank is missed.
        """
        view = self.cluster.view()
        return view.apply_sync(
            rank_call,
            _targets.METRICS_STREAM,
            self._address,
            self.receiver.key,
            self.interval,
        )

    def sync(self, timeout: float = 10.0) -> None:
        """Wait until everything the ranks recorded so far is in :attr:`store`.

        Runs on the ranks, so call it between cells (it waits for a running one).
        """
        seqs = self.cluster.view().apply_sync(rank_call, _targets.METRICS_FLUSH, timeout)
        want = dict(zip(self.cluster.ranks, seqs))
        if not self.store.wait_for(want, timeout):
            have = self.store.status()
            late = [r for r, s in want.items() if have.get(r, {}).get("seq", 0) < s]
            raise TimeoutError(f"records of ranks {late} did not arrive within {timeout:g}s")
        if not self.paused:
            self.refresh(everything=True)

    # ------------------------------------------------------------------ display
    @property
    def widget(self):
        """The ipywidgets box of all panels (built on first use; starts the redraws)."""
        if self._view is None:
            from clusterkernel.client.dashboard._views import DashboardView

            self._view = DashboardView(self.metric, self.window, self.max_points)
            self.refresh(everything=True)
            self._start_drawing()
        return self._view.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display

        from clusterkernel.client.dashboard._busy import keep_cell_busy

        keep_cell_busy()  # the widgets' comms must not make JupyterLab show Idle
        display(self.widget)

    def show(self) -> None:
        """Display the panels in a notebook; in a terminal, a progress line per rank."""
        from clusterkernel.client.output import in_notebook

        if in_notebook():
            self._ipython_display_()
        elif self._terminal is None:
            from clusterkernel.client.dashboard._terminal import TerminalProgress

            self._terminal = TerminalProgress(self.store, self.cluster.ranks, self.rate).start()

    def cell_finished(self) -> None:
        """After a cell: collect its last records; in a terminal print the summary.

        Never raises: it runs after the cell, whose own error must be the one shown.
        """
        try:
            if self.cluster.running and not self.cluster.lost:
                self.sync(timeout=10)
        except Exception as exc:  # the cell's outcome is reported by the cell
            self.error = exc
        if self._terminal is not None:
            print(self._terminal.finish())
            self._terminal = None

    def _start_drawing(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._draw_loop, name="clusterkernel-dashboard", daemon=True
            )
            self._thread.start()

    def _draw_loop(self) -> None:
        lower_thread_priority()
        period = 1.0 / self.rate
        due = time.monotonic()
        while True:
            # On a fixed cadence: waiting a whole period after each redraw would add
            # the redraw's own time every turn (4.7 redraws a second at rate 5); and
            # if late, redraw now rather than in a burst to catch up.
            due = max(due + period, time.monotonic())
            if self._stop.wait(due - time.monotonic()):
                return
            if not self.cluster.running:
                self.refresh(everything=True)
                return  # the cluster is gone; the last picture stays
            if not self._paused.is_set():
                self.refresh()

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused.is_set()

    def pause(self) -> None:
        """Stop redrawing (the panels keep their picture); the record keeps growing.

        For a machine where the browser's drawing slows the training: nothing is
        sent to the browser until :meth:`resume`. Safe from any thread, while a cell runs.

        Example::

            dash = cluster.dashboard()
            dash.pause()    # e.g. from a button, or before a timing-critical run
            dash.resume()   # catches up with everything logged meanwhile
        """
        self._paused.set()

    def resume(self) -> None:
        """Redraw again, starting with everything logged while paused."""
        self._timeline_at = self._status_at = 0.0  # every panel at the next redraw
        self._paused.clear()

    def refresh(self, everything: bool = False) -> None:
        """Redraw what changed (the drawing thread does this ``rate`` times a second).

        ``everything=True`` also redraws the panels that update less often now.
        """
        view = self._view
        if view is None:
            return
        with self._lock:  # the drawing thread and sync() may both get here
            if everything:
                self._timeline_at = self._status_at = 0.0
            t0 = time.perf_counter()
            try:
                sent = self._redraw(view)
            except Exception as exc:  # keep drawing; say what went wrong in the header
                self.error = exc
                view.set_header(f"dashboard error: {type(exc).__name__}: {exc}")
                return
            if sent:
                self.updates += 1
                self.update_seconds += time.perf_counter() - t0

    def _redraw(self, view: DashboardView) -> bool:
        # Each panel at the rate it is read at: the loss at ``rate`` (and only when
        # new data came), the timeline at TIMELINE_RATE, throughput and tables at
        # SLOW_RATE. Every update is a message through the Jupyter server and a
        # redraw in the browser (tens of ms of browser CPU each, whatever its size,
        # measured), which on a busy machine is CPU taken from the ranks.
        store = self.store
        version = store.version
        sent = False
        if version != self._drawn_version:
            self._drawn_version = version
            sent = view.loss.update(store) > 0
        now = time.monotonic()
        if now - self._timeline_at >= 1.0 / TIMELINE_RATE:
            self._timeline_at = now
            status = store.status()
            if any(s["age_s"] < self.window for s in status.values()):
                view.timeline.update(store, sorted(status))  # it scrolls without new data
                sent = True
        if now - self._status_at >= 1.0 / SLOW_RATE:
            self._status_at = now
            status = store.status()
            sent = view.throughput.update(store) > 0 or sent
            view.comm.update(store)
            view.status.update(store, self._cluster_states())
            sent = view.profile.update(self.cluster) or sent  # a profiled cell's last seconds
            records = sum(sum(s["records"].values()) for s in status.values())
            lost = sum(s["lost"] + s["gaps"] for s in status.values())
            note = f"; {lost} records LOST (see status)" if lost else ""
            run = store.heading()
            run = f"{run}; " if run else ""
            view.set_header(
                f"{run}{len(status)} ranks streaming; {store.messages} messages, "
                f"{records} records; {self.updates} redraws{note}"
            )
        return sent

    def _cluster_states(self) -> dict[int, dict]:
        if not self.cluster.running:
            return {r: {"state": "stopped"} for r in self.store.ranks()}
        try:
            return {row["rank"]: row for row in self.cluster.status()}
        except Exception:  # stopped or restarting: show what the stream knows
            return {}

    def clear(self) -> None:
        """Forget everything received so far and start the panels empty.

        The ranks keep their records (``metrics.recorder()``); what they record from
        now on shows. Each execution of a cell that logs is a run of its own anyway
        (earlier runs are drawn faint), so this is for a fresh picture.

        Example::

            dash = cluster.dashboard()
            dash.clear()   # then run the training cell again
            dash.store.runs()              # none until the next cell logs
        """
        self.store.clear()
        if not self.paused:
            self.refresh(everything=True)

    # ------------------------------------------------------------------ output
    def records(self, kind: str | None = None) -> list[dict]:
        """Every record received, as :mod:`clusterkernel.protocol.records` dicts."""
        return self.store.records(kind)

    def export(self, directory: str) -> dict:
        """Write scalars.csv, comm.csv, metrics.json, timeline.json (Chrome trace), dashboard.png."""
        return _export.export(self.store, directory, self.metric)

    def close(self) -> None:
        """Stop redrawing and receiving, and stop the ranks' streams. Safe to call twice."""
        if self.closed:
            return
        cluster = self.cluster
        if cluster._dashboard_closed(self) and cluster.running and not cluster.lost:
            # not waited for: a running cell would hold it up
            cluster.view().apply_async(rank_call, _targets.METRICS_STOP)
        self._quiet()

    def _streams_ended(self, cluster_stopped: bool) -> None:
        """The cluster's call (given it at start): the ranks no longer stream here.

        ``cluster_stopped``: the cluster stopped; draw the last picture (ranks stopped),
        never raising: a panel that cannot redraw (say, at interpreter exit) must not
        fail the cluster's stop. Else a newer dashboard took over. Then go quiet.
        """
        if cluster_stopped:
            try:
                self.refresh(everything=True)
            except Exception as exc:
                self.error = exc
        self._quiet()

    def _quiet(self) -> None:
        """Stop this dashboard's threads and socket (the panels keep their last picture)."""
        self.closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if self._terminal is not None:
            self._terminal.finish()
            self._terminal = None
        self.receiver.stop()
