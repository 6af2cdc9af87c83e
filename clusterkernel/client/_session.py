"""The session's cluster: the one ``%mpi start`` started (client side).

The magics set it (:func:`clusterkernel.client.cluster.set_current_cluster`); code that
defaults to it (``Dashboard()`` without a cluster, ``clusterkernel.current_cluster()``)
reads it here. It lives beside the packages, not in one of them, so that the
dashboard finds the session's cluster without importing the cluster package (the
cluster imports the dashboard, never the other way) and needs neither IPython nor the
magics.

Example::

    from clusterkernel.client import _session
    _session.cluster()   # None before %mpi start, then the running Cluster
"""

from __future__ import annotations

from typing import Any

# Any: this module knows no Cluster (nothing here imports the cluster package)
_cluster: Any = None


def cluster() -> Any:
    """The cluster ``%mpi start`` started (running or not), or None.

    Example::

        from clusterkernel.client.cluster import current_cluster
        current_cluster()      # the Cluster of %mpi start; None before it and after %mpi stop
    """
    return _cluster


def set_cluster(cluster: Any) -> None:
    """Make ``cluster`` the session's (the magics call this; None: there is none).

    Example::

        from clusterkernel.client.cluster import current_cluster, set_current_cluster
        set_current_cluster(cluster)      # what %mpi start does with the one it started
        current_cluster() is cluster      # True
        set_current_cluster(None)         # %mpi stop
    """
    global _cluster
    _cluster = cluster
