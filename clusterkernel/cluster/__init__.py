"""The client side of a run: launch the ranks, run cells on them, report their faults.

Everything here runs in the notebook (or the IPython REPL); nothing here runs on
a rank. :class:`Cluster` is the entry point; the private modules beside it each
do one part of its job: launching (``_launch``, ``_launcher_choice``, ``_slurm``,
``_guard``), its life cycle (``_lifecycle``, ``_session``, ``_status``), one
running cell (``runner``, ``_breakpoints``) and what a failing or hung rank
tells the user (``_rank_faults``, ``_jobreport``, ``_stacks``, ``_hangreport``).

Example::

    from clusterkernel.cluster import Cluster
    with Cluster(n=2) as cluster:
        cluster.run("from clusterkernel import comm; print(comm.rank())")
"""

from __future__ import annotations

from clusterkernel.cluster._cluster import CellInterrupted, Cluster, ClusterError, RankError

__all__ = ["Cluster", "ClusterError", "RankError", "CellInterrupted"]
