"""``Cluster``: ``n`` MPI ranks as ipyparallel engines, driven from the notebook (client side).

ipyparallel owns the controller, the processes and the transport; ``Cluster`` is the
façade a notebook user of an MPI job drives. It holds its settings and its named parts,
each the owner of one piece of its state (the package docstring says which and why),
and hands each question or call to the part that owns it (``_facade``: the part's
docstring and signature are the method's); what changes several parts at once (start,
stop, restart, attach, detach) is written here, telling the parts in order. A method
that only reads the cluster's public API is its helper's function bound by name
(``push = _data.push``).

Example::

    from clusterkernel import Cluster
    with Cluster(n=4) as cluster:
        cluster.run("from clusterkernel import comm; print(comm.rank())")
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from clusterkernel.client.cluster import (
    _data,
    _follow,
    _kept_records,
    _namespace,
    _preflight,
    _rank_faults,
    _snapshot,
    _torch,
)
from clusterkernel.client.cluster._cells import Cells
from clusterkernel.client.cluster._dashboard_port import DashboardPort
from clusterkernel.client.cluster._facade import part_method, part_property
from clusterkernel.client.cluster._keep_state import Keeping
from clusterkernel.client.cluster._namespace import RankNames
from clusterkernel.client.cluster._rankmap import RankMap
from clusterkernel.client.cluster._status import RankStatus
from clusterkernel.client.errors import CellInterrupted, ClusterError, RankError
from clusterkernel.client.launch import LaunchSettings, launcher_for
from clusterkernel.client.launch._ssh import Login, login_for
from clusterkernel.client.sync import _send as _code_sync

if TYPE_CHECKING:
    from clusterkernel.client.launch import Launcher

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

    profile_result = part_property("_cells", Cells, "profile_result")

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
        self._keeping = Keeping(keep)  # the keep time; who else drove these ranks
        # the one place the launch options are named: from here on they travel as one
        # object, the launcher's settings
        self.launcher = launcher_for(
            launcher, n=n, hosts=hosts, hostfile=hostfile, mpiexec=mpiexec,
            controller_ip=controller_ip, fault_tolerant=fault_tolerant, respawn=respawn,
            **scheduler_options,
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
        self.env, self.timeout, self.start_timeout = dict(env or {}), timeout, start_timeout
        self.guard, self.log_level, self.multi_node = guard, log_level, self.launcher.multi_node
        self.fault_tolerant = self.launcher.settings.fault_tolerant
        self.auto_respawn = self.launcher.settings.respawn  # implies fault_tolerant
        self.torch, self.backend = bool(torch or backend), backend
        self.gpus_per_rank, self.gpu_share = gpus_per_rank, gpu_share

        self.gpus: dict[int, list[int]] = {}  # rank -> its GPUs, from the binding at start
        self._status = RankStatus()
        self._ranks = RankMap()  # the processes while running; the lost set, dead ranks
        self._port = DashboardPort()  # the dashboard the ranks stream to
        self._cells = Cells(self._ranks, self.restart)  # the running cell's name, last profile
        self.rank_names = RankNames()  # what Tab offers while a rank cannot answer

    # ------------------------------------------------------------------ lifecycle
    @property
    def n(self) -> int:
        """The number of ranks (``launcher.settings.n`` holds it)."""
        return self.launcher.n

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<clusterkernel.Cluster n={self.n} {self.launcher.describe()} {state}>"

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    running = part_property("_ranks", RankMap, "running")
    job_id = part_property("_ranks", RankMap, "job_id")
    run_dir = part_property("_ranks", RankMap, "run_dir")
    cluster_file = part_property("_ranks", RankMap, "cluster_file")
    _engines = part_property("_ranks", RankMap, "engines")  # tests, benchmarks read it

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
        try:
            self._ranks.start(
                self.launcher, _torch.engine_env(self.env, group=self.torch),
                log_level=self.log_level, guard=self.guard, start_timeout=self.start_timeout,
                keep=self.keep if self.guard else None, progress=progress,
            )  # fmt: skip
            try:
                if progress is not None:
                    n, step = self.n, "; making the torch.distributed group" if self.torch else ""
                    progress(f"Starting {n} MPI ranks: {n} of {n} registered{step}")
                self._ranks_up()
                guard = self._ranks.running_engines().guard
                self._keeping.started(self, self._settings, guard.pid if guard else None)
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
        self._ranks.restart()
        self._ranks_up()
        self._keeping.note(self.run_dir, {"rank_info": self.rank_info})

    def _ranks_up(self, group: bool = True) -> None:
        """What every fresh set of ranks gets: torchrun's environment, and the group if
        asked (``group`` False: the ranks have theirs)."""
        self.gpus = _torch.ranks_up(self, self.backend if self.torch and group else False)

    def _ranks_going_down(self) -> None:
        """Before the ranks stop: destroy the torch.distributed groups of idle ranks."""
        if not self.lost:
            _torch.ranks_going_down(self)

    def _teardown(self, let_go: bool = False) -> None:
        """Stop the processes, or (``let_go``) leave them to a kept cluster's guard; either
        way this object no longer drives ranks."""
        try:
            self._ranks.stop(let_go)
        finally:
            self.gpus = {}
            self._keeping.stopped()  # a hold on a record on the login node ends
            self.rank_names.forget()
            self._port.stopped()  # after the ranks, so its last picture shows them stopped

    job_ended = part_method("_ranks", RankMap.job_ended, cluster=False)
    job_output = part_method("_ranks", RankMap.job_output, cluster=False)
    launcher_killed_by = part_method("_ranks", RankMap.launcher_killed_by, cluster=False)
    processes = part_method("_ranks", RankMap.processes, cluster=False)

    # ------------------------------------------------------------ keep / attach (_kept_records)
    keep = part_property("_keeping", Keeping, "keep")
    replaced = part_property("_keeping", Keeping, "replaced")
    taken_over_by = part_property("_keeping", Keeping, "taken_over_by")

    @property
    def id(self) -> str | None:
        """The id ``%mpi list`` shows and :meth:`attach` takes (None when stopped)."""
        return _kept_records.cluster_id(self.run_dir) if self.run_dir else None

    @classmethod
    def attach(
        cls, cluster_id: str | None = None, force: bool = False, ssh: str | Login | None = None
    ) -> Cluster:
        """Connect to a cluster started with ``keep`` (by this user, on this host): the
        ranks and their variables as they were. ``cluster_id``: as :func:`kept` lists it;
        may be left out when there is one. A cluster another live session drives is
        refused unless ``force`` (a takeover: that session is told at its next call;
        ``cluster.replaced`` names it here). ``ssh``: the login node of a cluster started
        from outside the cluster (``ssh=`` at its start; ``%mpi attach --ssh HOST``).

        Example::

            # not run: needs a cluster another process started with keep=
            cluster = Cluster.attach()      # %mpi attach
            cluster.pull("model_state")
            Cluster.attach("482913", ssh="login")   # one started with ssh="login"
        """
        where = login_for(ssh)
        keeping, record = Keeping.claimed(cluster_id, force, where)
        try:
            settings = dict(record["settings"], n=record["n"])
            if where is not None:  # the login node as this session reaches it
                settings.update(ssh=where.host, remote_python=where.python)
            cluster = cls(**settings, keep=keeping.keep)
            cluster._keeping = keeping
            cluster._ranks.attach(
                cluster.launcher, record["run_dir"], record["cluster_file"], record["rank_info"],
                _torch.engine_env(cluster.env, group=cluster.torch),
                keeper_pid=record.get("guard_pid"), log_level=cluster.log_level,
                keep=keeping.keep,
            )  # fmt: skip
        except BaseException:
            keeping.release(record["run_dir"])
            raise
        return cluster

    follow = _follow.follow

    def detach(self) -> None:
        """Leave a kept cluster running (its ranks, variables, Slurm job) and let go of it:
        it stops after its keep time without a client; :meth:`attach` comes back.

        Example::

            kept = Cluster(n=2, keep="10m").start()
            cluster_id = kept.id             # what %mpi list shows
            kept.detach()                    # %mpi detach: the ranks run on
            Cluster.attach(cluster_id).stop()   # back again, and stopped
        """
        self.require_running()
        self._keeping.release(self.run_dir)
        self._teardown(let_go=True)

    taken_over_note = _kept_records.taken_over_note

    def set_origin(self, origin: str) -> None:
        """Note in this kept cluster's record who started it (``origin``: the MPI kernel's
        own name), so that the kernel, restarted, finds it again in :func:`kept` (on the
        login node from outside: ``kept_records``). Nothing for a cluster not kept.

        Example::

            cluster.set_origin("kernel-3f2a")   # kept: kept() shows its origin 'kernel-3f2a'
        """
        self._keeping.note(self.run_dir, {"origin": origin})

    def _taken_over(self) -> dict | None:
        """The session that took this kept cluster over, if one did (we then let go)."""
        holder = self._keeping.taken_over(self.run_dir)
        if holder is not None:
            self._teardown(let_go=True)
        return holder

    # ------------------------------------------------- faults (_respawn, _rank_faults)
    respawn = part_method("_ranks", RankMap.respawn)

    def ranks_respawned(self, ranks: list[int], group_kept: bool = False) -> None:
        """New processes of ``ranks`` joined the job (``_respawn``): alive again; the
        torch.distributed group that spanned the dead ones is closed on the survivors
        and everything a fresh set of ranks gets is given to all of them. ``group_kept``:
        the ranks share a new default group of all N already (an in-cell recovery made
        it, ``_incell.ranks_back``): it stays."""
        self._ranks.revived(ranks)
        survivors = [r for r in self.ranks if r not in ranks]
        try:
            if not group_kept:
                self.abort_torch_groups(survivors)  # it still waits for the dead processes
        except Exception:  # no torch.distributed on the ranks: nothing to close
            pass
        self._ranks_up(group=not group_kept)
        self._port.ranks_back()
        self._keeping.note(self.run_dir, {"rank_info": self.rank_info})

    lost = part_property("_ranks", RankMap, "lost")
    dead = part_property("_ranks", RankMap, "dead")

    mark_lost = part_method("_ranks", RankMap.mark_lost, cluster=False)
    mark_dead = part_method("_ranks", RankMap.mark_dead, cluster=False)

    frames = _rank_faults.frames
    stacks = _rank_faults.stacks
    dead_ranks = _rank_faults.dead_ranks
    out_of_memory = _rank_faults.out_of_memory
    signal = _rank_faults.signal
    interrupt = _rank_faults.interrupt
    abort_torch_groups = _rank_faults.abort_torch_groups
    debug = _rank_faults.debug
    sync = _code_sync.sync  # %mpi sync: the notebook side's modules to every rank's host

    # ------------------------------------------------------------------ ranks
    @property
    def client(self) -> ipp.Client:
        """The ipyparallel client (engine ids equal to ranks are not guaranteed)."""
        self.require_running()
        engines = self._ranks.engines
        assert engines is not None and engines.client is not None
        return engines.client

    ranks = part_property("_ranks", RankMap, "ranks")
    engine_of = part_property("_ranks", RankMap, "engine_of")
    rank_info = part_property("_ranks", RankMap, "rank_info")

    @property
    def live_ranks(self) -> list[int]:
        """The ranks cells run on by default: all but those that died."""
        # a fault-tolerant job's rank whose engine the controller lost died between cells
        ft = self.fault_tolerant
        causes = lambda ranks: _rank_faults.death_causes(self, ranks)  # noqa: E731
        return self._ranks.live_ranks((lambda: self.client.ids) if ft else None, causes)

    def engine_id(self, rank: int) -> int:
        """The engine id of ``rank``; a clear error for a dead rank or one that does not exist."""
        self.require_running()
        return self._ranks.engine_id(rank, self.n, lambda: self.live_ranks)

    rank_of = part_method("_ranks", RankMap.rank_of, cluster=False)

    def view(self, ranks: list[int] | None = None) -> ipp.DirectView:
        """A DirectView of the engines for ``ranks`` (default: live ones), in rank order."""
        ranks = self.live_ranks if ranks is None else list(ranks)
        view = self.client[[self.engine_id(r) for r in ranks]]
        view.label = self._cells.label  # the ranks' name of the cell (run())
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

    status = part_method("_status", RankStatus.status)

    # ------------------------------------ the ranks' variables (_data, _snapshot, _torch)
    push = _data.push
    pull = _data.pull
    snapshot = _snapshot.snapshot
    restore = _snapshot.restore
    torch_group = _torch.torch_group
    torch_reinit = _torch.torch_reinit

    # ----------------------------------------- cells, the dashboard (_cells, _dashboard_port)
    complete = _namespace.complete
    inspect = _namespace.inspect
    run = part_method("_cells", Cells.run)
    profile = part_method("_cells", Cells.profile)
    dashboard = part_method("_port", DashboardPort.dashboard)
    # the one private port: a Dashboard tells its cluster these two things, and asks it
    # for its receiver (a relay on the login node to it from outside the cluster)
    _dashboard_streaming = part_method("_port", DashboardPort.streaming, cluster=False)
    _dashboard_closed = part_method("_port", DashboardPort.closed, cluster=False)
    _dashboard_receiver = part_method("_port", DashboardPort.receiver)
