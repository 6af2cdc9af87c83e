"""Deprecated: ``clusterkernel.mpiexec`` moved to :mod:`clusterkernel.client.mpiexec`.

Kept for one release so that old imports keep working; importing it warns
(``DeprecationWarning``) with the new path. It forwards the public names only (the
old path's private submodules are gone).

Example::

    from clusterkernel import HostError, MPINotFoundError   # the errors, public names
    from clusterkernel.client.mpiexec import MPIRuntime     # the module's new path
"""

import warnings

from clusterkernel.client.mpiexec import *  # noqa: F403

warnings.warn(
    "clusterkernel.mpiexec is deprecated and goes away in the next release: import "
    "clusterkernel.client.mpiexec instead.",
    DeprecationWarning,
    stacklevel=2,
)
