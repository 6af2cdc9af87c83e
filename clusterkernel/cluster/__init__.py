"""The client side of a run: launch the ranks, run cells on them, report their faults.

Everything here runs in the notebook (or the IPython REPL); nothing here runs on
a rank. :class:`Cluster` is the entry point; the private modules beside it each
do one part of its job: launching (``_launch_settings``: the launch options as one
object, :class:`LaunchSettings`, which builds the launcher; ``_launch``, ``_slurm``,
``_guard``), the processes of a running cluster (``_lifecycle.Engines``), what every
fresh set of ranks gets (``_torch``: torchrun's environment, the default group),
``_session`` and ``_status``, one running cell (``runner``, ``_breakpoints``),
what a failing or hung rank tells the user (``_rank_faults``, ``_jobreport``,
``_stacks``, ``_hangreport``), clusters kept past their session (``_keep``: the
record, list, claim; ``_follow``: a cell another session left running) and Tab
answered by a rank (``_namespace``).

Who calls whom: ``Cluster`` owns one ``Engines`` while it runs and alone changes it
(start, restart, stop); ``runner.CellRun``, the fault reports and ``_torch`` reach
the cluster through its public methods and properties only (``client``, ``view``,
``engine_id``, ``restart``, ``mark_lost``, ``abort_torch_groups``...). The dashboard
and the cluster still tell each other when one of them stops (``_dashboard_*``). A
kept cluster's guard process reads its record (``_keep``) and never calls back.

Example (``cluster``: a running :class:`Cluster`, from ``Cluster(n=4).start()`` or
``%mpi start -n 4``; README.md starts one)::

    cluster.run("from clusterkernel import comm; print(comm.rank())")   # a %%mpi cell
    [row["state"] for row in cluster.status()]   # ['idle', 'idle', 'idle', 'idle']
"""

from __future__ import annotations

from clusterkernel.cluster._cluster import CellInterrupted, Cluster, ClusterError, RankError
from clusterkernel.cluster._launch_settings import LaunchSettings

__all__ = ["Cluster", "ClusterError", "RankError", "CellInterrupted", "LaunchSettings"]
