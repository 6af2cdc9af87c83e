"""A cluster's dashboard port: the one dashboard its ranks stream to (client side).

:class:`DashboardPort` is the part of a :class:`~clusterkernel.Cluster` that owns which
:class:`~clusterkernel.client.dashboard.Dashboard` its ranks stream to, and what that
dashboard asked to be told. A Dashboard tells its cluster two things, through the
cluster's ``_dashboard_streaming`` and ``_dashboard_closed`` (which hand them here): its
streams start (it is the cluster's now; an older one is told it no longer is) and it
closes. The port tells a dashboard only through the ``ended`` callback it gave, and
otherwise calls its public ``attach`` (new ranks need their streams). The dashboard
never imports this package: it is handed the cluster (its ``Streamed`` protocol).

Example::

    port = DashboardPort()
    told = []
    port.streaming("dash", told.append)   # a Dashboard(cluster) says this
    port.stopped()                        # the cluster stopped: told == [True]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clusterkernel.client.launch._relay import Relay

if TYPE_CHECKING:
    from clusterkernel.client.dashboard import Dashboard
    from clusterkernel.client.dashboard._receiver import Receiver
    from clusterkernel.client.dashboard._store import MetricsStore


class DashboardPort:
    """The dashboard a cluster's ranks stream to, and its callback (see the module)."""

    def __init__(self) -> None:
        self._current: Dashboard | None = None  # the one the ranks stream to
        self._current_ended: Callable[[bool], None] | None = None  # what it asked to be told
        # from outside the cluster: the current dashboard's relay, and the one made for
        # a dashboard not yet streaming (its receiver made, its ranks not yet told)
        self._relay: Relay | None = None
        self._new_relay: Relay | None = None

    def receiver(self, cluster: Any, store: MetricsStore) -> tuple[Receiver, str]:
        """A receiver of ``store``'s records, started, and the address the ranks stream to.

        On this machine's loopback for one host; on all its interfaces where ranks on
        other hosts reach it; from outside the cluster on loopback, with a relay on the
        login node as the ranks' address (see the module).
        """
        from clusterkernel.client.dashboard._receiver import Receiver

        login = getattr(cluster.launcher, "login", None)
        wide = cluster.multi_node and login is None
        rx = Receiver(store, "0.0.0.0" if wide else "127.0.0.1").start()
        if login is None:
            return rx, rx.address
        try:
            relay = Relay(login, rx.address, cluster.launcher.controller_ip())
        except BaseException:
            rx.stop()
            raise
        _close(self._new_relay)  # a dashboard that failed to start
        self._new_relay = relay
        return rx, relay.address

    def dashboard(self, cluster: Any) -> Dashboard:
        """This cluster's live dashboard, streaming; made on first use.

        One per cluster: ``%mpi dashboard`` and ``%%mpi --dashboard`` show this one,
        so every cell that asks for it shows the same live panels. It stops when
        the cluster stops (its panels keep their last picture); after
        :meth:`restart` this call makes the new ranks stream to it.

        Example::

            dash = cluster.dashboard()
            dash.show()                 # the panels, or a progress line in a terminal
            cluster.run("import clusterkernel; clusterkernel.log(step=0, loss=1.0)")
            dash.sync(); dash.records("scalar")
        """
        from clusterkernel.client.dashboard import Dashboard

        dash = self._current
        if dash is None or dash.closed:
            return Dashboard(cluster)  # becomes the cluster's (streaming)
        dash.attach()  # after a restart the new ranks need their streams
        return dash

    def streaming(self, dash: Dashboard, ended: Callable[[bool], None]) -> None:
        """``dash`` now receives the ranks' records: it is the cluster's. ``ended(stopped)``
        is called once its streams end: ``ended(False)`` when a newer dashboard takes
        over, ``ended(True)`` when the cluster stops or lets go of its ranks."""
        old, old_ended = self._current, self._current_ended
        self._current, self._current_ended = dash, ended
        if old is not dash:
            _close(self._relay)
            self._relay, self._new_relay = self._new_relay, None
        if old is not None and old is not dash and old_ended is not None:
            old_ended(False)

    def closed(self, dash: Dashboard) -> bool:
        """``dash`` is closing: True if it was the cluster's (it no longer is)."""
        if self._current is not dash:
            _close(self._new_relay)  # one that failed to start closes
            self._new_relay = None
            return False
        _close(self._relay)
        self._relay = None
        self._current, self._current_ended = None, None
        return True

    def ranks_back(self) -> None:
        """Respawned ranks joined: a live dashboard attaches their streams."""
        dash = self._current
        if dash is not None and not dash.closed:
            dash.attach()

    def stopped(self) -> None:
        """The cluster no longer drives ranks: its dashboard is told, once (``ended(True)``)."""
        ended, self._current, self._current_ended = self._current_ended, None, None
        try:
            if ended is not None:
                ended(True)
        finally:
            relays, self._relay, self._new_relay = (self._relay, self._new_relay), None, None
            try:
                _close(relays[0])
            finally:
                _close(relays[1])


def _close(relay: Relay | None) -> None:
    """Close ``relay``, if there is one."""
    if relay is not None:
        # what it said is not an error here: at the cluster's stop the master connection
        # has gone first, and ssh says so
        relay.close()
