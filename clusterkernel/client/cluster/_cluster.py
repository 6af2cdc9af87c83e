"""``Cluster``: ``n`` MPI ranks as ipyparallel engines, driven from the notebook (client side).

ipyparallel owns the controller, the processes and the transport; ``Cluster`` is the
façade a notebook user of an MPI job drives, over named parts beside it (this
package's docstring lists them): it owns the cluster's state and alone changes it
(start, stop, restart, attach, respawn, the dashboard its ranks stream to). A method
that only reads the cluster through its public API and acts on its ranks is its part's
function, taking the cluster, bound here by name (``push = _data.push``): the part is
the method, docstring and all, and ``test_ownership`` checks that it changes nothing.

Example::

    from clusterkernel import Cluster
    with Cluster(n=4) as cluster:
        cluster.run("from clusterkernel import comm; print(comm.rank())")
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from clusterkernel.client.cluster import (
    _data,
    _follow,
    _keep,
    _namespace,
    _preflight,
    _rank_faults,
    _respawn,
    _snapshot,
    _torch,
)
from clusterkernel.client.cluster._health import RankHealth
from clusterkernel.client.cluster._launch_settings import LaunchSettings, launcher_for
from clusterkernel.client.cluster._lifecycle import Engines
from clusterkernel.client.cluster._namespace import RankNames
from clusterkernel.client.cluster._status import RankStatus
from clusterkernel.client.errors import CellInterrupted, ClusterError, RankError, format_ranks

if TYPE_CHECKING:
    from clusterkernel.client.cluster._launch import Launcher
    from clusterkernel.client.cluster._respawn import Respawned
    from clusterkernel.client.cluster.runner import CellRun
    from clusterkernel.client.dashboard import Dashboard

__all__ = ["Cluster", "ClusterError", "RankError", "CellInterrupted"]


class Cluster:
    """Start, watch and stop ``n`` MPI ranks as ipyparallel engines.

    Parameters
    ----------
    n : number of MPI ranks (>= 1). Default 4, or inside a Slurm allocation
        (``salloc``/``sbatch``) the allocation's number of tasks.
    hosts : ``"a:2,b:2"`` (host:slots) for several machines; implies the
        controller listens on all interfaces. Default: this machine only, and
        everything listens on loopback.
    hostfile : an MPI hostfile instead of ``hosts``.
    mpiexec : path to ``mpiexec``; default: next to ``sys.executable``, then PATH.
    launcher : ``"mpiexec"`` or a scheduler, ``"slurm"`` or ``"sge"`` (Grid Engine).
        Default: ``"slurm"`` inside a Slurm allocation (a job step over its nodes),
        else ``"mpiexec"``. Or a
        :class:`~clusterkernel.client.cluster.LaunchSettings` (or the launcher it built) that
        holds every launch option (``n`` to ``fault_tolerant`` here), given once and
        passed as one object; then those arguments are left out.
    **scheduler_options : the scheduler's job shape, as its class declares
        (:mod:`clusterkernel.client.scheduler`). Slurm: ``nodes``, ``partition``,
        ``time`` (default 01:00:00, as for an exported job; None: the partition's),
        ``account``, ``gpus_per_node``, ``gres``, ``slurm_args`` (extra ``#SBATCH``
        options; ``srun``'s inside an allocation). Grid Engine: ``queue``, ``pe`` (the
        parallel environment, default ``mpi``), ``time``, ``sge_args``. Checked as an
        exported job's file is: a bad value is a ``ValueError`` at ``Cluster(...)``.
    controller_ip : the address the controller listens on. Default: loopback
        for one machine; for a scheduler, the address through which this machine
        reaches its nodes; ``"*"`` listens on every interface.
    env : extra environment variables for the ranks (e.g. ``OMP_NUM_THREADS``).
    timeout : default watchdog for :meth:`run` in seconds (None: no watchdog).
    start_timeout : seconds to wait for all engines to register (time a Slurm
        job waits in the queue does not count).
    fault_tolerant : keep the job running when a rank dies (Open MPI's ULFM):
        the cell reports the dead rank, later cells run on the others, and
        :meth:`restart` brings back a full set. Default: a dead rank ends the job.
    torch : make torch.distributed's default process group on every rank after
        start and every restart (``%mpi start --torch``). Every rank has
        torchrun's environment (RANK, LOCAL_RANK, MASTER_ADDR, ...) either way.
    backend : the group's backend, ``"gloo"`` or ``"nccl"`` (implies ``torch``);
        default: torch's pick by device (gloo for CPU tensors, nccl for CUDA).
    gpus_per_rank : GPUs each rank gets by its ``LOCAL_RANK`` (torch's current device
        is the first). Default: one where a host has GPUs; 0: no binding. More ranks
        on a node than GPUs is an error at start unless ``gpu_share``.
    respawn : after a cell that saw a rank die, bring it back with a copy of the
        lowest live rank's variables (:meth:`respawn`; implies ``fault_tolerant``).
    keep : let the ranks outlive this process (``"2h"``, ``"30m"``, seconds, or
        ``True``: until stopped): when it dies or :meth:`detach` es, the controller,
        ranks and any Slurm job keep running, their variables intact, until no client
        has been attached for that long. :meth:`attach` (``%mpi attach``) comes back.
        Default: nothing outlives the process that started it.

    Example::

        cluster = Cluster(n=2).start()
        cluster.run("print('hi')")      # [rank 0] hi / [rank 1] hi
        cluster.stop()

    Example (other starts)::

        # not run: a Slurm job, and clusters left running for other examples
        Cluster(n=8, launcher="slurm", nodes=2, time="1:00:00").start()
        slurm = LaunchSettings(n=8, launcher="slurm", nodes=2, time="1:00:00")
        Cluster(launcher=slurm, torch=True).start()   # the same launch, said once
        Cluster(n=2, torch=True).start()    # dist.is_initialized() on every rank
        Cluster(n=4, keep="2h").start()     # later, in another process:
        cluster = Cluster.attach()          # the same ranks, their variables intact
    """

    profile_result = None
    """The :class:`~clusterkernel.client.profile.Profile` of the last ``run(..., profile=True)``."""

    def __init__(
        self,
        n: int | None = None,
        hosts: str | list[str] | None = None,
        hostfile: str | None = None,
        mpiexec: str | None = None,
        *,
        launcher: str | LaunchSettings | Launcher | None = None,
        controller_ip: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        start_timeout: float = 90.0,
        guard: bool = True,
        log_level: int = logging.WARNING,
        fault_tolerant: bool = False,
        torch: bool = False,
        backend: str | None = None,
        gpus_per_rank: int | None = None,
        gpu_share: bool = False,
        keep: bool | str | float | None = None,
        respawn: bool = False,
        **scheduler_options: Any,
    ) -> None:
        _torch.check_backend_name(backend)
        _preflight.check_gpus_per_rank(gpus_per_rank)
        self.keep = _keep.parse_keep(keep)  # seconds, inf, or None: not kept
        # the one place the launch options are named: from here on they travel as one
        # object, the launcher's settings
        self.launcher = launcher_for(
            launcher,
            LaunchSettings(
                n=n, hosts=hosts, hostfile=hostfile, mpiexec=mpiexec,
                controller_ip=controller_ip, fault_tolerant=fault_tolerant or respawn,
                **scheduler_options,
            ),
        )  # fmt: skip
        # GPUs or a backend this machine cannot give its own ranks: refused before any start
        _preflight.check_local(
            self.launcher, backend=backend, gpus_per_rank=gpus_per_rank, gpu_share=gpu_share,
            env=env,
        )  # fmt: skip
        # None where a scheduler's own step (srun) starts the ranks
        self.runtime = getattr(self.launcher, "runtime", None)
        # what attach() needs to make this Cluster again in another process
        self._settings = {
            **self.launcher.settings.record(), "env": dict(env or {}), "timeout": timeout,
            "start_timeout": start_timeout, "torch": torch, "backend": backend,
            "gpus_per_rank": gpus_per_rank, "gpu_share": gpu_share,
        }  # fmt: skip
        self.n, self.multi_node = self.launcher.n, self.launcher.multi_node
        self.env, self.timeout, self.start_timeout = dict(env or {}), timeout, start_timeout
        self.guard, self.log_level = guard, log_level
        self.fault_tolerant = self.launcher.settings.fault_tolerant
        if respawn and not self.fault_tolerant:
            raise ValueError("respawn=True needs fault_tolerant=True (the launcher given says no).")
        self.auto_respawn = respawn  # after a cell that saw a rank die, respawn it
        self.torch, self.backend = bool(torch or backend), backend
        self.gpus_per_rank, self.gpu_share = gpus_per_rank, gpu_share

        self._engines: Engines | None = None  # the processes, while running
        self.gpus: dict[int, list[int]] = {}  # rank -> its GPUs, from the binding at start
        self._status = RankStatus()
        self._health = RankHealth()  # the lost engine set, dead ranks: lost, dead
        self._dashboard: Dashboard | None = None  # the one the ranks stream to
        self._dashboard_ended: Callable[[bool], None] | None = None  # what it asked to be told
        self.replaced: dict | None = None  # the session attach(force=True) took over from
        self.taken_over_by: dict | None = None  # the session that took this one's place
        self.rank_names = RankNames()  # what Tab offers while a rank cannot answer

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<clusterkernel.Cluster n={self.n} {self.launcher.describe()} {state}>"

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._engines is not None

    @property
    def job_id(self) -> str | None:
        """The batch job of the engines (``launcher="slurm"``/``"sge"`` outside an
        allocation), else None."""
        engine_set = self._engines.engine_set if self._engines is not None else None
        return getattr(engine_set, "job_id", None) or None

    @property
    def run_dir(self) -> str | None:
        """The private directory of this cluster's files (None when stopped)."""
        return self._engines.run_dir if self._engines is not None else None

    @property
    def cluster_file(self) -> str | None:
        """ipyparallel's cluster file, from which a client can connect (None when stopped)."""
        return self._engines.cluster_file if self._engines is not None else None

    def start(self, progress: Callable[[str | None], Any] | None = None) -> Cluster:
        """Start the controller and ``n`` ranks; return ``self``.

        Raises :class:`ClusterError` at once (with the launcher's output) if the
        engines fail to start, instead of waiting out ``start_timeout``. A Slurm
        job waiting in the queue shows its state on a live line; a kernel
        interrupt cancels it.

        ``progress``: called with a line saying where the start is (``"2 of 4 ranks
        registered"``, a Slurm job's state) each time that changes, then with None once
        the start has ended, done or failed; ``%mpi start`` shows it in place. Without
        it a start prints a live line only while a job is queued or after 20 s.
        """
        if self.running:
            raise ClusterError(
                "This cluster is already running. Use restart() (%mpi restart) or stop() first."
            )
        self._health.started()
        try:
            self._engines = Engines.start(
                self.launcher, _torch.engine_env(self.env, group=self.torch),
                log_level=self.log_level, guard=self.guard, start_timeout=self.start_timeout,
                keep=self.keep if self.guard else None, progress=progress,
            )  # fmt: skip
            try:
                if progress is not None:
                    n, step = self.n, "; making the torch.distributed group" if self.torch else ""
                    progress(f"Starting {n} MPI ranks: {n} of {n} registered{step}")
                self._ranks_up()
                if self.keep is not None:
                    guard = self._engines.guard
                    guard_pid = guard.pid if guard is not None else None
                    record = _keep.new_record(self, self._settings, guard_pid)
                    _keep.write(self.run_dir, record)
            except BaseException:
                self._teardown()
                raise
        finally:
            if progress is not None:
                progress(None)
        return self

    def stop(self) -> None:
        """Stop every rank and the controller; return once their processes are gone.

        Safe to call twice. A kept cluster another session took over is left to it.
        """
        if not self.running or self._taken_over():
            return
        try:
            self._ranks_going_down()
        finally:
            self._teardown()

    def restart(self) -> None:
        """Stop all ranks (stuck ones included) and start a full set again.

        Engine state is lost: re-run imports and setup cells afterwards. With
        ``torch=True`` the new ranks get a new default process group.
        """
        if not self.running:
            raise ClusterError("The cluster is not running; use start() (%mpi start).")
        self._ranks_going_down()
        self._engines.restart()
        self._health.restarted()
        self._ranks_up()
        if self.keep is not None:
            _keep.update(self._engines.run_dir, {"rank_info": self._engines.rank_info})

    def _ranks_up(self) -> None:
        """What every fresh set of ranks gets: torchrun's environment, and the group if asked."""
        self.gpus = _torch.ranks_up(self, self.backend if self.torch else False)

    def _ranks_going_down(self) -> None:
        """Before the ranks stop: destroy the torch.distributed groups of idle ranks."""
        if not self.lost:
            _torch.ranks_going_down(self)

    def _teardown(self) -> None:
        try:
            if self._engines is not None:
                self._engines.teardown()
        finally:
            self._forget_ranks()

    def _forget_ranks(self) -> None:
        """This object no longer drives ranks (stopped, or left to a kept cluster's guard)."""
        self._engines = None
        self._health.forgotten()
        self.gpus = {}
        self.rank_names.forget()
        ended, self._dashboard, self._dashboard_ended = self._dashboard_ended, None, None
        if ended is not None:  # after the ranks, so its last picture shows them stopped
            ended(True)

    def job_ended(self) -> bool:
        """Whether the MPI job under the engines has ended (False when stopped)."""
        return self._engines is not None and self._engines.ended()

    def job_output(self, lines: int = 40) -> str:
        """The last ``lines`` of what the launcher (mpiexec, srun, the Slurm job) said."""
        return self._engines.output(lines) if self._engines is not None else ""

    def processes(self) -> list[int]:
        """Pids of every local process of this cluster (controller, mpiexec, ranks...)."""
        return self._engines.processes() if self._engines is not None else []

    # ------------------------------------------------------------ keep / attach (_keep)
    @property
    def id(self) -> str | None:
        """The id ``%mpi list`` shows and :meth:`attach` takes (None when stopped)."""
        return _keep.cluster_id(self.run_dir) if self.run_dir else None

    @classmethod
    def attach(cls, cluster_id: str | None = None, force: bool = False) -> Cluster:
        """Connect to a cluster started with ``keep`` (by this user, on this host): the
        ranks and their variables as they were. ``cluster_id``: as :func:`kept` lists it;
        may be left out when there is one. A cluster another live session drives is
        refused unless ``force`` (a takeover: that session is told at its next call;
        ``cluster.replaced`` names it here).

        Example::

            # not run: needs a cluster another process started with keep=
            cluster = Cluster.attach()      # %mpi attach
            cluster.pull("model_state")
        """
        record = _keep.to_attach(cluster_id)
        settings = dict(record["settings"], n=record["n"])
        cluster = cls(**settings, keep=True if record["keep_s"] is None else record["keep_s"])
        try:
            cluster.replaced = _keep.claim(record["run_dir"], force)
        except ValueError as e:
            raise ClusterError(str(e)) from None
        try:
            cluster._engines = Engines.attach(
                cluster.launcher, record["run_dir"], record["cluster_file"], record["rank_info"],
                _torch.engine_env(cluster.env, group=cluster.torch),
                keeper_pid=record.get("guard_pid"), log_level=cluster.log_level,
            )  # fmt: skip
        except BaseException:
            _keep.release(record["run_dir"])
            raise
        return cluster

    follow = _follow.follow

    def detach(self) -> None:
        """Leave a kept cluster running (its ranks, variables, Slurm job) and let go of it:
        it stops after its keep time without a client; :meth:`attach` comes back.

        Example::

            kept = Cluster(n=2, keep="10m").start()
            kept.detach()                    # %mpi detach: the ranks run on
            Cluster.attach(kept.id).stop()   # back again, and stopped
        """
        self.require_running()
        if self.keep is None:
            raise ClusterError(
                "This cluster was not started with keep: detaching would leave ranks no one "
                "can reach. Stop it (%mpi stop), or start with --keep 2h (keep='2h')."
            )
        _keep.release(self._engines.run_dir)
        self._let_go()

    def _let_go(self) -> None:
        """Forget the processes without stopping them (the guard keeps them)."""
        try:
            if self._engines is not None:
                self._engines.detach()
        finally:
            self._forget_ranks()

    taken_over_note = _keep.taken_over_note

    def _taken_over(self) -> dict | None:
        """The session that took this kept cluster over, if one did (we then let go)."""
        if self.keep is None or self._engines is None:
            return None
        holder = _keep.holder(self._engines.run_dir)
        if holder is None or holder.get("pid") == os.getpid():
            return None
        self._let_go()
        self.taken_over_by = holder
        return holder

    # ------------------------------------------------- faults (_respawn, _rank_faults)
    def respawn(
        self, source: int | None = None, timeout: float = 120.0, from_snapshot: bool = False
    ) -> Respawned:
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
        dead = _respawn.check(self, source)
        if not dead:
            return _respawn.Respawned(source=source)
        try:
            return _respawn.respawn(self, self._engines, dead, source, timeout, from_snapshot)
        except _respawn.RespawnFailed as e:
            for rank, why in e.died.items():
                self._health.ranks_died([rank], why)
            raise

    def ranks_respawned(self, ranks: list[int]) -> None:
        """New processes of ``ranks`` joined the job (``_respawn``): alive again; the
        torch.distributed group that spanned the dead ones is closed on the survivors
        and everything a fresh set of ranks gets is given to all of them."""
        self._health.revived(ranks)
        survivors = [r for r in self.ranks if r not in ranks]
        try:
            self.abort_torch_groups(survivors)  # it still waits for the dead processes
        except Exception:  # no torch.distributed on the ranks: nothing to close
            pass
        self._ranks_up()
        if self._dashboard is not None and not self._dashboard.closed:
            self._dashboard.attach()
        if self.keep is not None:
            _keep.update(self._engines.run_dir, {"rank_info": self._engines.rank_info})

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

    frames = _rank_faults.frames
    stacks = _rank_faults.stacks
    dead_ranks = _rank_faults.dead_ranks
    out_of_memory = _rank_faults.out_of_memory
    signal = _rank_faults.signal
    interrupt = _rank_faults.interrupt
    abort_torch_groups = _rank_faults.abort_torch_groups
    debug = _rank_faults.debug

    # ------------------------------------------------------------------ ranks
    @property
    def client(self) -> ipp.Client:
        """The ipyparallel client (engine ids equal to ranks are not guaranteed)."""
        self.require_running()
        assert self._engines is not None and self._engines.client is not None
        return self._engines.client

    @property
    def ranks(self) -> list[int]:
        """Every rank of the job, dead ones (fault-tolerant jobs) included."""
        return sorted(self._engines.engine_of) if self._engines is not None else []

    @property
    def engine_of(self) -> dict[int, int]:
        """``{rank: engine id}`` of the running ranks (a copy)."""
        return dict(self._engines.engine_of) if self._engines is not None else {}

    @property
    def rank_info(self) -> dict[int, dict]:
        """``{rank: {"rank", "host", "pid", "engine", "oom"}}`` as each rank reported at start
        (``oom``: its memory cgroup's OOM-kill counter then, see :meth:`out_of_memory`)."""
        return dict(self._engines.rank_info) if self._engines is not None else {}

    @property
    def live_ranks(self) -> list[int]:
        """The ranks cells run on by default: all but those that died."""
        if self.fault_tolerant and self.running:
            # Its nanny has told the controller, which unregistered the engine; the
            # job itself lives on (fault-tolerant only).
            gone = _rank_faults.lost_engines(self.engine_of, self.client.ids, self._health.dead)
            self._health.ranks_died(gone, "its process exited between cells")
        return [r for r in self.ranks if not self._health.is_dead(r)]

    def engine_id(self, rank: int) -> int:
        """The engine id of ``rank``; a clear error for a dead rank or one that does not exist."""
        self.require_running()
        if self._health.is_dead(rank):
            live = self.live_ranks
            raise ClusterError(
                f"Rank {rank} died ({self._health.why_dead(rank)}); ranks {format_ranks(live)} "
                f"still run. %mpi respawn --from {live[0]} (cluster.respawn(source=...)) "
                "brings it back."
            )
        try:
            return self._engines.engine_of[rank]
        except KeyError:
            raise ValueError(f"Rank {rank} does not exist; ranks are 0..{self.n - 1}.") from None

    def rank_of(self, engine_id: int) -> int:
        """The rank whose engine is ``engine_id`` (KeyError: none)."""
        return {eid: rank for rank, eid in self.engine_of.items()}[engine_id]

    def view(self, ranks: list[int] | None = None) -> ipp.DirectView:
        """A DirectView of the engines for ``ranks`` (default: live ones), in rank order."""
        ranks = self.live_ranks if ranks is None else list(ranks)
        view = self.client[[self.engine_id(r) for r in ranks]]
        view.label = getattr(self, "_cell_label", None)  # the ranks' name of the cell (run())
        return view

    def require_running(self) -> None:
        """Raise :class:`ClusterError`, saying what to do, unless this cluster's ranks run
        and this session drives them (another may have taken a kept cluster over)."""
        if self._taken_over() is not None or self.taken_over_by is not None:
            raise ClusterError(self.taken_over_note())
        if not self.running:
            raise ClusterError("No MPI ranks are running. Start them with %mpi start -n 4.")
        if self.lost:
            raise ClusterError(f"{self.lost} Run %mpi restart (cluster.restart()).")

    def status(self) -> list[dict]:
        """One dict per rank: rank, host, pid, state, cpu %, memory (MiB), and ``gpu``
        (name, memory, utilisation) where the ranks are bound to GPUs.

        CPU and memory are read for ranks on this machine; on other hosts they are None.
        """
        self.require_running()
        rows = self._status.rows(self.client, self._engines.rank_info, self.multi_node)
        if self.gpus:  # name, memory, utilisation of each rank's GPU
            gpu = _torch.gpu_status(self)
            for row in rows:
                row["gpu"] = gpu.get(row["rank"])
        return rows

    # ------------------------------------ the ranks' variables (_data, _snapshot, _torch)
    push = _data.push
    pull = _data.pull
    snapshot = _snapshot.snapshot
    restore = _snapshot.restore
    torch_group = _torch.torch_group
    torch_reinit = _torch.torch_reinit

    # ------------------------------------------------------------------ run
    complete = _namespace.complete
    inspect = _namespace.inspect

    def run(
        self,
        code: str,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        block: bool = True,
        renderer=None,
        dashboard: bool = False,
        profile: bool = False,
    ) -> CellRun:
        """Run ``code`` on the ranks, streaming each rank's output; the call behind ``%%mpi``.

        Raises :class:`RankError` naming the failing ranks, and
        :class:`CellInterrupted` on a kernel interrupt or when ``timeout``
        (default: ``self.timeout``) passes; stuck ranks are reported with their
        stacks and freed, by a restart if nothing else works.

        With ``block=False`` returns a :class:`~clusterkernel.client.cluster.runner.CellRun` at
        once; call its ``wait()`` to stream and collect.

        ``dashboard=True`` (``%%mpi --dashboard``) shows :meth:`dashboard` first
        and, when the cell has run, collects its last records into it.

        ``profile=True`` (``%%mpi --profile``) samples every rank's Python stacks while
        the cell runs and shows, under it, each rank's top lines and what the slowest
        rank does more than the median rank; the :class:`~clusterkernel.client.profile.Profile`
        is kept as ``cluster.profile_result`` (also when the cell raised or was stopped).
        """
        import secrets

        from clusterkernel.client.cluster.runner import CellFaults, CellRun
        from clusterkernel.protocol.records import CELL_LABEL

        self.require_running()
        explicit = ranks is not None
        ranks = self.live_ranks if ranks is None else sorted(set(ranks))
        new = self._health.untold() if not explicit else []
        if new:  # a death between cells is always told, once, before the next cell
            print(_respawn.death_notice(self, new), file=sys.stderr)
        for r in ranks:
            self.engine_id(r)  # clear error for a rank that does not exist
        dash = self.dashboard() if dashboard else None
        if dash is not None:
            dash.show()
        # one name per cell, the same on every rank: the dashboard's runs (CELL_LABEL)
        self._cell_label = f"{CELL_LABEL}{secrets.token_hex(6)}"
        faults = CellFaults(
            job_ended=self._health.job_ended, ranks_died=self._health.ranks_died,
            ranks_stuck=lambda _ranks: self.restart(),
        )  # fmt: skip
        run = None
        try:
            run = CellRun(self, code, ranks, renderer=renderer, faults=faults, profile=profile)
            if not block:
                return run
            try:
                return run.wait(timeout=self.timeout if timeout is None else timeout)
            except RankError as e:
                self._health.untold()  # ranks that died in this cell: its error names them
                if self.auto_respawn and self.running and self._health.dead:
                    e.note = "\n".join(n for n in (e.note, _respawn.after_death(self)) if n)
                raise
        finally:
            if dash is not None and block:
                dash.cell_finished()
            if profile and block:
                self.profile_result = run.profile if run is not None else None

    def profile(self, action: str = "start", **options: Any):
        """``%mpi profile start|stop``: sample every rank over the cells in between.

        ``"start"`` starts every live rank's sampler (``torch=True``: torch.profiler's
        CPU ops too); ``"stop"`` ends it, shows the :class:`~clusterkernel.client.profile.
        Profile` and returns it (also kept as ``profile_result``). Misuse (stop without
        start, start twice) raises :class:`~clusterkernel.client.profile.ProfileError`.
        ``options`` go to :func:`clusterkernel.client.profile.control` (``torch``, ``hz``, ...).

        Example::

            cluster.profile("start")
            cluster.run("import time; time.sleep(0.1)")
            p = cluster.profile("stop")
        """
        from clusterkernel.client.profile import control

        self.require_running()
        profile = control(self, action, **options)
        if profile is not None:
            self.profile_result = profile
        return profile

    # ------------------------------------------------------------------ dashboard
    def dashboard(self) -> Dashboard:
        """This cluster's live dashboard, streaming; made on first use.

        One per cluster: ``%mpi dashboard`` and ``%%mpi --dashboard`` show this one,
        so every cell that asks for it shows the same live panels. It stops when
        the cluster stops (its panels keep their last picture); after
        :meth:`restart` this call makes the new ranks stream to it.

        Example::

            dash = cluster.dashboard()
            dash.show()                 # the panels, or a progress line in a terminal
            cluster.run("import clusterkernel; clusterkernel.log(step=0, loss=1.0)")
            dash.sync(); dash.records("scalar")
        """
        from clusterkernel.client.dashboard import Dashboard

        dash = self._dashboard
        if dash is None or dash.closed:
            return Dashboard(self)  # becomes this cluster's (_dashboard_streaming)
        dash.attach()  # after a restart the new ranks need their streams
        return dash

    # The dashboard's port: a Dashboard tells its cluster these two things, and the
    # cluster tells it only through the ``ended`` callback it gave (never its methods).
    def _dashboard_streaming(self, dash: Dashboard, ended: Callable[[bool], None]) -> None:
        """``dash`` now receives the ranks' records: it is this cluster's. ``ended(stopped)``
        is called once its streams end: ``ended(False)`` when a newer dashboard takes
        over, ``ended(True)`` when the cluster stops or lets go of its ranks."""
        old, old_ended = self._dashboard, self._dashboard_ended
        self._dashboard, self._dashboard_ended = dash, ended
        if old is not None and old is not dash and old_ended is not None:
            old_ended(False)

    def _dashboard_closed(self, dash: Dashboard) -> bool:
        """``dash`` is closing: True if it was this cluster's (it no longer is)."""
        if self._dashboard is not dash:
            return False
        self._dashboard, self._dashboard_ended = None, None
        return True
