"""Deprecated: ``clusterkernel.magics`` moved to :mod:`clusterkernel.client.magics`.

Kept for one release so that old imports keep working; importing it warns
(``DeprecationWarning``) with the new path. It forwards the public names only (the
old path's private submodules are gone).

Example::

    %load_ext clusterkernel                  # loads the magics, as before
    cluster = clusterkernel.current_cluster()   # the Cluster %mpi start made
"""

import warnings

from clusterkernel.client.magics import *  # noqa: F403

warnings.warn(
    "clusterkernel.magics is deprecated and goes away in the next release: import "
    "clusterkernel.client.magics instead (the cluster %mpi start made: "
    "clusterkernel.current_cluster()).",
    DeprecationWarning,
    stacklevel=2,
)
