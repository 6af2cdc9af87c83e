"""A cluster's ranks: its running processes and what is wrong with them (client side).

:class:`RankMap` is the part of a :class:`~clusterkernel.Cluster` that owns its ranks:
the processes while they run (one ``_lifecycle.Engines``, from a start or an attach)
and their health (``_health.RankHealth``: the lost engine set, the dead ranks). It
answers what the cluster is asked about its ranks (which there are, their engines,
the live ones, where the job's files are) and changes only through its own methods,
which the cluster calls when it starts, restarts, stops, attaches or lets go, and
which a cell's faults report through (``mark_lost``, ``mark_dead``). Its fields are
its own: no other module writes or reads them (``tests/cluster/test_ownership.py``).

Example::

    ranks = RankMap()
    (ranks.running, ranks.ranks, ranks.lost)   # (False, [], None): nothing started yet
    ranks.mark_lost("The MPI job ended: rank 1 died.")
    ranks.lost                                 # 'The MPI job ended: rank 1 died.'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clusterkernel.client.cluster import _rank_faults, _respawn
from clusterkernel.client.cluster._health import RankHealth
from clusterkernel.client.cluster._lifecycle import Engines
from clusterkernel.client.errors import ClusterError, format_ranks

if TYPE_CHECKING:
    from clusterkernel.client.cluster._respawn import Respawned


class RankMap:
    """The running ranks of one cluster and their health (see the module)."""

    def __init__(self) -> None:
        self._live_engines: Engines | None = None  # the processes, while running
        self._health = RankHealth()  # the lost engine set, dead ranks

    # ------------------------------------------------------------------ the processes
    @property
    def engines(self) -> Engines | None:
        """The running processes (None when stopped), for the parts that act on them."""
        return self._live_engines

    def running_engines(self) -> Engines:
        """The running processes; a :class:`ClusterError` when stopped."""
        if self._live_engines is None:
            raise ClusterError("No MPI ranks are running. Start them with: %mpi start -n 4")
        return self._live_engines

    @property
    def running(self) -> bool:
        """Whether ranks run (started or attached; not stopped or let go)."""
        return self._live_engines is not None

    @property
    def job_id(self) -> str | None:
        """The batch job of the engines (``launcher="slurm"``/``"sge"`` outside an
        allocation), else None."""
        engine_set = self._live_engines.engine_set if self._live_engines is not None else None
        return getattr(engine_set, "job_id", None) or None

    @property
    def run_dir(self) -> str | None:
        """The private directory of this cluster's files (None when stopped)."""
        return self._live_engines.run_dir if self._live_engines is not None else None

    @property
    def cluster_file(self) -> str | None:
        """ipyparallel's cluster file, from which a client can connect (None when stopped)."""
        return self._live_engines.cluster_file if self._live_engines is not None else None

    def job_ended(self) -> bool:
        """Whether the MPI job under the engines has ended (False when stopped)."""
        return self._live_engines is not None and self._live_engines.ended()

    def launcher_killed_by(self) -> int | None:
        """The signal that ended the launcher's own process (mpiexec), where one did:
        Open MPI's crash (11, SIGSEGV), or a kill from outside; else None."""
        return self._live_engines.killed_by() if self._live_engines is not None else None

    def job_output(self, lines: int = 40) -> str:
        """The last ``lines`` of what the launcher (mpiexec, srun, the Slurm job) said."""
        return self._live_engines.output(lines) if self._live_engines is not None else ""

    def processes(self) -> list[int]:
        """Pids of every local process of this cluster (controller, mpiexec, ranks...)."""
        return self._live_engines.processes() if self._live_engines is not None else []

    def start(self, *args: Any, **options: Any) -> None:
        """Start the processes (``Engines.start``'s arguments): a new set, not lost."""
        self._health.started()
        self._live_engines = Engines.start(*args, **options)

    def attach(self, *args: Any, **options: Any) -> None:
        """Connect to a kept cluster's processes (``Engines.attach``'s arguments)."""
        self._live_engines = Engines.attach(*args, **options)

    def restart(self) -> None:
        """A full new set of ranks replaces the old one: nothing is wrong any more."""
        self.running_engines().restart()
        self._health.restarted()

    def stop(self, let_go: bool = False) -> None:
        """Stop the processes, or (``let_go``) leave them running to a kept cluster's
        guard; either way this map no longer has them (``lost`` stays, see RankHealth)."""
        try:
            if self._live_engines is not None:
                self._live_engines.detach() if let_go else self._live_engines.teardown()
        finally:
            self._live_engines = None
            self._health.forgotten()

    def respawn(
        self, cluster: Any, source: int | None = None, timeout: float = 120.0,
        from_snapshot: bool = False,
    ) -> Respawned:  # fmt: skip
        """Bring dead ranks back: the job is N ranks again, with the same rank numbers.

        Needs ``fault_tolerant=True`` (Open MPI's ULFM). The survivors are the same
        processes, every variable kept; each new rank starts empty, or with a copy of
        rank ``source``'s picklable variables (torch modules and optimizers included;
        the report names what could not be copied), or with ``from_snapshot=True`` each
        from its own last :meth:`snapshot`. comm's groups are made again, and
        with ``torch=True`` a new default group spans the N ranks (DDP models on the
        survivors: ``torchdist.rewrap``). Returns a report; ``report.ranks`` is empty
        when no rank had died.

        Example::

            import os, signal, time
            with Cluster(n=2, fault_tolerant=True) as ft:
                ft.run("x = 41")
                os.kill(ft.rank_info[1]["pid"], signal.SIGKILL)   # rank 1 dies
                while ft.live_ranks != [0]:
                    time.sleep(0.1)
                print(ft.respawn(source=0).summary())   # %mpi respawn --from 0
                ft.pull("x")                            # {0: 41, 1: 41}
        """
        if from_snapshot and source is not None:
            raise ValueError("respawn: give source= or from_snapshot=True, not both.")
        dead = _respawn.check(cluster, source)
        if not dead:
            return _respawn.Respawned(source=source)
        try:
            return _respawn.respawn(
                cluster, self.running_engines(), dead, source, timeout, from_snapshot
            )
        except _respawn.RespawnError as e:
            for rank, why in e.died.items():
                self._health.ranks_died([rank], why)
            if e.ended is not None:
                self._health.job_ended(e.ended)
            raise

    # ------------------------------------------------------------------ health
    @property
    def lost(self) -> str | None:
        """Why the whole engine set is gone (until :meth:`restart`), or None."""
        return self._health.lost

    @property
    def dead(self) -> dict[int, str]:
        """``{rank: how it died}``: ranks of a fault-tolerant job that died (a copy)."""
        return self._health.dead

    def mark_lost(self, why: str) -> None:
        """Record that the whole engine set is gone (until :meth:`restart`)."""
        self._health.job_ended(why)

    def mark_dead(self, ranks: list[int], why: str) -> None:
        """Record ranks of a fault-tolerant job as dead (the job carries on)."""
        self._health.ranks_died(ranks, why)

    def untold(self) -> list[int]:
        """Dead ranks not yet told to the user (and from now on counted as told)."""
        return self._health.untold()

    def rejoined(self, ranks: list[int]) -> None:
        """New processes of dead ranks registered while a cell ran (auto-respawn, the
        survivors started them): read their identity; they are alive again."""
        engines = self.running_engines()
        engines.respawned([engines.engine_of[r] for r in ranks])
        self._health.revived(ranks)

    def revived(self, ranks: list[int]) -> None:
        """Dead ranks were respawned into the live job: they are alive again."""
        self._health.revived(ranks)

    # ------------------------------------------------------------------ ranks
    @property
    def ranks(self) -> list[int]:
        """Every rank of the job, dead ones (fault-tolerant jobs) included."""
        return sorted(self._live_engines.engine_of) if self._live_engines is not None else []

    @property
    def engine_of(self) -> dict[int, int]:
        """``{rank: engine id}`` of the running ranks (a copy)."""
        return dict(self._live_engines.engine_of) if self._live_engines is not None else {}

    @property
    def rank_info(self) -> dict[int, dict]:
        """``{rank: {"rank", "host", "pid", "engine", "oom"}}`` as each rank reported at start
        (``oom``: its memory cgroup's OOM-kill counter then, see :meth:`out_of_memory`)."""
        return dict(self._live_engines.rank_info) if self._live_engines is not None else {}

    def live_ranks(
        self,
        engine_ids: Callable[[], list[int]] | None,
        causes: Callable[[list[int]], dict[int, str]] | None = None,
    ) -> list[int]:
        """Every rank but those that died. ``engine_ids``: the engines the controller still
        has (a fault-tolerant job's); a rank whose engine left them died between cells,
        ``causes(ranks)`` says how (``_rank_faults.death_causes``)."""
        if engine_ids is not None and self._live_engines is not None:
            # Its nanny has told the controller, which unregistered the engine; the
            # job itself lives on (fault-tolerant only).
            gone = _rank_faults.lost_engines(self.engine_of, engine_ids(), self._health.dead)
            if gone:
                told = causes(gone) if causes is not None else {}
                for rank in gone:
                    self._health.ranks_died([rank], told.get(rank, "its process exited"))
        return [r for r in self.ranks if not self._health.is_dead(r)]

    def engine_id(self, rank: int, n: int, live: Callable[[], list[int]]) -> int:
        """The engine id of ``rank`` of ``n``; a clear error for a dead rank (``live()``: the
        ranks that still run, named in it) or one that does not exist."""
        if self._health.is_dead(rank):
            alive = live()
            raise ClusterError(
                f"Rank {rank} died ({self._health.why_dead(rank)}); ranks {format_ranks(alive)} "
                f"still run. %mpi respawn --from {alive[0]} (cluster.respawn(source=...)) "
                "brings it back."
            )
        try:
            return self.running_engines().engine_of[rank]
        except KeyError:
            raise ValueError(f"Rank {rank} does not exist; ranks are 0..{n - 1}.") from None

    def rank_of(self, engine_id: int) -> int:
        """The rank whose engine is ``engine_id`` (KeyError: none)."""
        return {eid: rank for rank, eid in self.engine_of.items()}[engine_id]
