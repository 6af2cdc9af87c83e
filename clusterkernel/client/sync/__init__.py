"""The user's own modules on every rank: ``%mpi sync`` / ``sync(cluster)`` (client side).

A notebook's helpers (``model.py``, ``data.py``, a package of its own) are edited on the
notebook's side; :func:`sync` sends the files that changed to a directory on each
rank's host (``sync/<host>`` in the cluster's run directory, 0700), first on every
rank's ``sys.path``, and reloads the changed modules the ranks have imported, with
IPython's autoreload machinery, so an edit takes effect without a restart and the
ranks' variables stay. The files travel over the ipyparallel connection, one rank per
host writing them: no shared file system between the notebook and the nodes is assumed.

- ``_files``: what a sync sends (the files named, or the folder's ``*.py``), read,
  hashed, checked for size and syntax before anything travels;
- ``_send``: the trip, what each host holds, the reload, the report (:class:`Synced`).

The rank side is :mod:`clusterkernel.rank._sync`, called by name.

Example (``cluster``: a running :class:`~clusterkernel.Cluster`)::

    from clusterkernel.client.sync import sync
    print(sync(cluster, ["mypkg"]).summary())   # the same as %mpi sync mypkg
"""

from __future__ import annotations

from clusterkernel.client.sync._files import MAX_FILE_BYTES, MAX_TOTAL_BYTES, SyncError
from clusterkernel.client.sync._send import Synced, sync

__all__ = ["sync", "Synced", "SyncError", "MAX_FILE_BYTES", "MAX_TOTAL_BYTES"]
