"""The session's cluster: the one ``%mpi start`` started (client side).

The magics set it; code that defaults to it (``Dashboard()`` without a cluster)
reads it here, so that code needs neither IPython nor the magics, and the magics
and the dashboard do not import each other.

Example::

    from clusterkernel.client.cluster import _session
    _session.cluster()   # None before %mpi start, then the running Cluster
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

_cluster: Cluster | None = None


def cluster() -> Cluster | None:
    """The cluster ``%mpi start`` started (running or not), or None."""
    return _cluster


def set_cluster(cluster: Cluster | None) -> None:
    """Make ``cluster`` the session's (the magics call this; None: there is none)."""
    global _cluster
    _cluster = cluster
