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

        cluster = current_cluster()   # clusterkernel.client.cluster's name for it
        cluster.n if cluster is not None else 0
    """
    return _cluster


def set_cluster(cluster: Any) -> None:
    """Make ``cluster`` the session's (the magics call this; None: there is none).

    Example::

        set_current_cluster(Cluster(n=2).start())   # what %mpi start does
        set_current_cluster(None)                   # %mpi stop
    """
    global _cluster
    _cluster = cluster
