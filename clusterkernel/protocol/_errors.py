"""The one base of every error clusterkernel raises on purpose, on both sides.

Each public error is a :class:`ClusterkernelError` and also the builtin kind it is
(``RuntimeError`` for a state that stops the work, ``ValueError`` for bad input), so
code written against either catches it. The magics catch this base to turn an error
of the user's making into one short line (IPython's ``UsageError``).

Example::

    import clusterkernel
    try:
        clusterkernel.Cluster(n=2).run("x = 1")      # never started
    except clusterkernel.ClusterkernelError as e:
        print(e)          # No MPI ranks are running. Start them with %mpi start -n 4.
"""

from __future__ import annotations


class ClusterkernelError(Exception):
    """The base of clusterkernel's errors: the notebook's (``ClusterError``,
    ``RankError``, ...) and the ranks' (``CommError``, ``BackendError``, ...)."""
