"""Deprecated: ``clusterkernel.cluster`` moved to :mod:`clusterkernel.client.cluster`.

Kept for one release so that old imports keep working; importing it warns
(``DeprecationWarning``) with the new path. It forwards the public names only (the
old path's private submodules are gone).

Example::

    from clusterkernel import Cluster, ClusterError          # public names
    from clusterkernel.client.cluster import LaunchSettings  # the module's new path
"""

import warnings

from clusterkernel.client.cluster import *  # noqa: F403

warnings.warn(
    "clusterkernel.cluster is deprecated and goes away in the next release: import "
    "clusterkernel.client.cluster instead.",
    DeprecationWarning,
    stacklevel=2,
)
