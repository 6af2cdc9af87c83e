"""The client side of a run: launch the ranks, run cells on them, report their faults.

Everything here runs in the notebook (or the IPython REPL); nothing here runs on
a rank. :class:`Cluster` is the entry point; how its ranks are launched is
:mod:`clusterkernel.client.launch` (the launch options as one object,
:class:`LaunchSettings`; the launchers by kind; the run directory, the guard, the wait
for engines). The private modules here each do one part of its job: the processes of a
running cluster (``_lifecycle.Engines``), what every
fresh set of ranks gets (``_torch``: torchrun's environment, the default group),
``_status``, one running cell (``runner``; its ``breakpoint()``
prompt is ``clusterkernel.client.debug._breakpoints``),
what a failing or hung rank tells the user (``_rank_faults``, ``_jobreport``,
``_stacks``, ``_hangreport``), clusters kept past their session (``_kept_records``: the
record, list, claim; ``_follow``: a cell another session left running), the ranks'
variables (``_data``: push, pull; ``_snapshot``) and Tab answered by a rank
(``_namespace``).

``Cluster`` is a façade over named parts, each the owner of one piece of its state
(``_facade`` makes its properties and methods that a part answers, docstrings and
signatures the part's):

- ``_rankmap.RankMap``: the ranks, the processes while they run (one
  ``_lifecycle.Engines``) and their health (``_health.RankHealth``: the lost engine
  set, the dead ranks): ``ranks``, ``engine_of``, ``live_ranks``, ``engine_id``,
  ``lost``, ``dead``, ``respawn``...;
- ``_keep_state.Keeping``: the keep time and the takeover record (``keep``,
  ``replaced``, ``taken_over_by``), writing and claiming the kept record (``_kept_records``);
- ``_dashboard_port.DashboardPort``: the one dashboard the ranks stream to, and its
  receiver (from outside the cluster, a relay on the login node to it);
- ``_cells.Cells``: a cell run (``run``, ``profile``), the running cell's name, the last
  profile; ``_status.RankStatus``: ``status`` (each rank's process, for its CPU %).

Why parts and not one class: the state is four unrelated things (processes, keep,
dashboard, cells) with their own rules, each now read and changed in one small
module; ``Cluster`` keeps its settings (``n``, ``env``, ``timeout``...), ``gpus`` and
``rank_names``, and what changes several parts at once (``start``, ``stop``,
``restart``, ``attach``, ``detach``, ``ranks_respawned``), so the order of those
steps is written in one place.

Who calls whom, and who changes what:

- ``Cluster`` owns its state through its parts and alone changes it: a part's fields
  are its own (no other module, ``Cluster``'s included, writes or reads them: they
  change through its methods); nothing outside ``_cluster.py`` writes a field of
  ``Cluster`` (the magics set the public ``timeout`` setting).
- ``Cluster`` makes ``runner.CellRun`` (``run``), ``client.debug.DebugSession`` (``debug``)
  and ``Dashboard`` (``dashboard``, ``run(dashboard=True)``) and calls their public
  methods. They read the cluster through its public methods and properties
  (``client``, ``view``, ``engine_id``, ``live_ranks``, ``running``, ``lost``...) and
  act on its ranks (``stacks``, ``interrupt``, ``abort_torch_groups``), but never
  change the cluster: a ``CellRun`` reports the job's end, dead ranks and ranks
  stuck for good through the ``runner.CellFaults`` the cluster gave it, and the
  cluster marks itself lost, records them or restarts. A ``Dashboard`` tells its
  cluster that the ranks stream to it and that it closes, and asks it for its
  receiver (``_dashboard_streaming``, ``_dashboard_closed``, ``_dashboard_receiver``:
  the one private port, ``Cluster``'s, handed to its ``DashboardPort``); the cluster
  tells it that its streams ended only through the callback it gave then.
- The helpers (``_rank_faults``, ``_torch``, ``_namespace``, ``_follow``, ``_data``,
  ``_snapshot``, ``_stacks``, ``_hangreport``, ``debug._breakpoints``) are the bodies of
  Cluster's and CellRun's methods: they take the cluster, read it the same public way
  and return what they find, which the cluster records (``_rank_faults.lost_engines``:
  the ranks whose engines left; ``_torch.ranks_up``: each rank's GPUs). A method that
  changes nothing of the cluster is its helper's function, bound in the class by name
  (``push = _data.push``; ``stacks``, ``debug``, ``complete``, ``snapshot``...); those
  that change its state are its parts' methods or written in ``_cluster.py``.
  ``CellRun`` prompts at a ``breakpoint()`` through ``debug._breakpoints.Stops``, which opens a ``DebugSession``.
- The magics drive the cluster through its public API only: ``Cluster`` and the
  functions this package exports (the session's cluster, kept clusters, snapshot
  reports). A kept cluster's guard process reads its record (``_kept_records``) and never
  calls back.
- The dependency is one way: this package imports ``client.dashboard`` and
  ``client.debug``, never the reverse. They are handed what they need: the cluster
  itself, typed by their own protocols (``dashboard.Streamed``, ``debug.Debugged``), and
  the debugger a function that sends to the ranks (``_ipp.asker``). The session's
  cluster, which ``Dashboard()`` defaults to, lives beside both
  (``clusterkernel.client._session``).
  ``tests/cluster/test_ownership.py`` checks these rules in the source.

Example (``cluster``: a running :class:`Cluster`, from ``Cluster(n=4).start()`` or
``%mpi start -n 4``; README.md starts one)::

    cluster.run("from clusterkernel import comm; print(comm.rank())")   # a %%mpi cell
    [row["state"] for row in cluster.status()]   # ['idle', 'idle', 'idle', 'idle']
"""

from __future__ import annotations

from clusterkernel.client._session import cluster as current_cluster
from clusterkernel.client._session import set_cluster as set_current_cluster
from clusterkernel.client.cluster._cluster import CellInterrupted, Cluster, ClusterError, RankError
from clusterkernel.client.cluster._follow import busy_ranks
from clusterkernel.client.cluster._kept_list import kept_records, kept_report
from clusterkernel.client.cluster._kept_records import describe_keep, kept
from clusterkernel.client.cluster._snapshot import summary as snapshot_summary
from clusterkernel.client.cluster._torch import subgroups_note
from clusterkernel.client.launch import LaunchSettings

__all__ = [
    "Cluster",
    "ClusterError",
    "RankError",
    "CellInterrupted",
    "LaunchSettings",
    "current_cluster",
    "set_current_cluster",
    "kept",
    "kept_report",
    "kept_records",
    "describe_keep",
    "busy_ranks",
    "snapshot_summary",
    "subgroups_note",
]
