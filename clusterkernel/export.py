"""Deprecated: ``clusterkernel.export`` moved to :mod:`clusterkernel.client.export`.

Kept for one release so that old imports keep working; importing it warns
(``DeprecationWarning``) with the new path. It forwards the public names only (the
old path's private submodules are gone).

Example::

    from clusterkernel.client.export import export_cells, write_job   # the new path
"""

import warnings

from clusterkernel.client.export import *  # noqa: F403

warnings.warn(
    "clusterkernel.export is deprecated and goes away in the next release: import "
    "clusterkernel.client.export instead.",
    DeprecationWarning,
    stacklevel=2,
)
