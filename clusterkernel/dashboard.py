"""Deprecated: ``clusterkernel.dashboard`` moved to :mod:`clusterkernel.client.dashboard`.

Kept for one release so that old imports keep working; importing it warns
(``DeprecationWarning``) with the new path. It forwards the public names only (the
old path's private submodules are gone).

Example::

    from clusterkernel import Dashboard                      # public name
    from clusterkernel.client.dashboard import MetricsStore  # the module's new path
"""

import warnings

from clusterkernel.client.dashboard import *  # noqa: F403

warnings.warn(
    "clusterkernel.dashboard is deprecated and goes away in the next release: import "
    "clusterkernel.client.dashboard instead.",
    DeprecationWarning,
    stacklevel=2,
)
