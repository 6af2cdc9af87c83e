"""An MPI engine set: ipyparallel engines, one per rank (client side).

:class:`Cluster` wraps ``ipyparallel.Cluster``: ipyparallel owns the controller,
the processes and the transport; this class adds what a notebook user of an MPI
job needs on top: a launcher (``mpiexec`` here or on a host list, or a Slurm
job), the engine-id to rank map, fast and clear start-up errors, status per rank,
a guard process that stops the cluster if the notebook kernel dies, stacks of
busy ranks on any host, pdb on ranks (:meth:`debug`), its live dashboard
(:meth:`dashboard`), and :meth:`run`, the call behind ``%%mpi``.

Example::

    from clusterkernel import Cluster
    with Cluster(n=4) as cluster:
        cluster.run("from clusterkernel import comm; print(comm.rank())")
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp
import psutil

from clusterkernel import _engine_setup, _ipp_dates, _stacks
from clusterkernel._jobreport import dead_ranks, job_report
from clusterkernel._launch import (
    Guard,
    MpiexecLauncher,
    make_run_dir,
    private_cluster_file,
    remove_run_dir,
    wait_for_engines,
)
from clusterkernel._status import RankStatus
from clusterkernel.errors import CellInterrupted, ClusterError, RankError, format_ranks
from clusterkernel.mpiexec import MPIRuntime, check_hosts_resolve, parse_hosts

if TYPE_CHECKING:
    from clusterkernel.dashboard import Dashboard
    from clusterkernel.runner import CellRun

__all__ = ["Cluster", "ClusterError", "RankError", "CellInterrupted"]

LAUNCHERS = ("mpiexec", "slurm")

_ipp_dates.install()  # ~49 us less per rank and cell in the notebook (BENCHMARKS.md, issue 11)


def _ipp_log(level: int) -> logging.Logger:
    """ipyparallel's logger for our clusters, kept out of the notebook.

    In a kernel ipyparallel logs to the cell's stdout, so ``%mpi stop`` would print
    every engine's start-up log and "exit_code 1" (mpiexec's normal exit when its
    ranks are stopped). What matters (failed starts, dead ranks) this module reports
    itself; the log is still there for ``logging`` configured by the user.
    """
    log = logging.getLogger("clusterkernel.ipyparallel")
    log.setLevel(level)
    if not log.handlers:  # no "last resort" printing to stderr either
        log.addHandler(logging.NullHandler())
    return log


def _live_line(text: str | None) -> None:
    """A status line rewritten in place (terminal and notebook both honour ``\\r``)."""
    if text is None:
        print(flush=True)
    else:
        print(f"\r{text}   ", end="", flush=True)


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
    launcher : ``"mpiexec"`` or ``"slurm"``. Default: ``"slurm"`` inside a Slurm
        allocation (a job step over its nodes), else ``"mpiexec"``.
    nodes, partition, time, account, slurm_args : the Slurm job's shape
        (``launcher="slurm"``): ranks spread over ``nodes`` nodes; ``slurm_args``
        are extra ``#SBATCH`` options (``srun`` options inside an allocation).
    controller_ip : the address the controller listens on. Default: loopback
        for one machine; for Slurm, the address through which this machine
        reaches the nodes; ``"*"`` listens on every interface.
    env : extra environment variables for the ranks (e.g. ``OMP_NUM_THREADS``).
    timeout : default watchdog for :meth:`run` in seconds (None: no watchdog).
    start_timeout : seconds to wait for all engines to register (time a Slurm
        job waits in the queue does not count).
    fault_tolerant : keep the job running when a rank dies (Open MPI's ULFM):
        the cell reports the dead rank, later cells run on the others, and
        :meth:`restart` brings back a full set. Default: a dead rank ends the job.

    Example::

        cluster = Cluster(n=2).start()
        cluster.run("print('hi')")      # [rank 0] hi / [rank 1] hi
        cluster.stop()

        Cluster(n=8, launcher="slurm", nodes=2, time="1:00:00").start()
    """

    def __init__(
        self,
        n: int | None = None,
        hosts: str | list[str] | None = None,
        hostfile: str | None = None,
        mpiexec: str | None = None,
        *,
        launcher: str | None = None,
        nodes: int | None = None,
        partition: str | None = None,
        time: str | None = "0:30:00",
        account: str | None = None,
        slurm_args: tuple[str, ...] | list[str] = (),
        controller_ip: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        start_timeout: float = 90.0,
        guard: bool = True,
        log_level: int = logging.WARNING,
        fault_tolerant: bool = False,
    ) -> None:
        from clusterkernel import _slurm

        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"n must be a positive integer number of ranks, got {n!r}.")
        if hosts and hostfile:
            raise ValueError("Give either hosts= or hostfile=, not both.")
        if hostfile and not os.path.isfile(hostfile):
            raise FileNotFoundError(f"Hostfile {hostfile!r} does not exist.")
        if launcher is None:
            launcher = "slurm" if _slurm.in_allocation() and not (hosts or hostfile) else "mpiexec"
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}; got {launcher!r}.")
        if launcher == "slurm":
            if hosts or hostfile:
                raise ValueError("Slurm chooses the hosts: leave out hosts=/hostfile=.")
            if fault_tolerant:
                raise ValueError("fault_tolerant=True needs launcher='mpiexec' (Open MPI's ULFM).")
            self.launcher = _slurm.SlurmLauncher(
                n,
                nodes=nodes,
                partition=partition,
                time=time,
                account=account,
                slurm_args=slurm_args,
                controller_ip=controller_ip,
            )
            self.runtime = None
        else:
            if nodes or partition or account or slurm_args:
                raise ValueError(
                    "nodes=, partition=, account= and slurm_args= are for launcher='slurm'."
                )
            parsed = parse_hosts(hosts)
            check_hosts_resolve(parsed)
            self.runtime = MPIRuntime.detect(mpiexec)
            self.launcher = MpiexecLauncher(
                self.runtime,
                n or 4,
                parsed,
                hostfile,
                fault_tolerant=fault_tolerant,
                controller_ip=controller_ip,
            )
        self.n = self.launcher.n
        self.multi_node = self.launcher.multi_node
        self.env = dict(env or {})
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.guard = guard
        self.log_level = log_level
        self.fault_tolerant = fault_tolerant

        self._ipp: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self._rank_info: dict[int, dict] = {}  # rank -> {rank, host, pid, engine}
        self._engine_of: dict[int, int] = {}  # rank -> engine id
        self._status = RankStatus()
        self._run_dir: str | None = None
        self._guard: Guard | None = None
        self.lost: str | None = None  # why the engine set is gone, if it is
        self.dead: dict[int, str] = {}  # rank -> how it died (fault-tolerant jobs)
        self._dashboard: Dashboard | None = None  # the one the ranks stream to

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
        return self._ipp is not None

    @property
    def job_id(self) -> str | None:
        """The Slurm job of the engines (``launcher="slurm"`` outside an allocation)."""
        return getattr(self._engine_set(), "job_id", None) or None

    def start(self) -> Cluster:
        """Start the controller and ``n`` ranks; return ``self``.

        Raises :class:`ClusterError` at once (with the launcher's output) if the
        engines fail to start, instead of waiting out ``start_timeout``. A Slurm
        job waiting in the queue shows its state on a live line; a kernel
        interrupt cancels it.
        """
        if self.running:
            raise ClusterError(
                "This cluster is already running. Use restart() (%mpi restart) or stop() first."
            )
        self.lost = None
        kwargs: dict[str, Any] = {}
        ip = self.launcher.controller_ip()  # may ask Slurm: before anything is made
        if ip:
            kwargs["controller_ip"] = ip
        self._run_dir = make_run_dir()
        try:
            self._ipp = ipp.Cluster(
                engines=self.launcher.engines(),
                n=self.n,
                profile_dir=self._run_dir,
                config=self.launcher.config(self._engine_env(), self._run_dir),
                log_level=self.log_level,
                log=_ipp_log(self.log_level),
                **kwargs,
            )
            self._ipp.start_controller_sync()
            self._client = self._ipp.connect_client_sync()
            private_cluster_file(self._ipp)
            if self.guard:
                self._guard = Guard(self._ipp.cluster_file, self._run_dir)
            self._ipp.start_engines_sync(self.n)
            self._ipp.update_cluster_file()  # now with the job id, for the guard
            self._wait_for_new_engines(old_pids=set())
        except BaseException:
            self._teardown()
            raise
        return self

    def _engine_env(self) -> dict[str, str]:
        env = dict(self.env)
        # Figures made on a rank are sent to the notebook when shown.
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        return env

    def _engine_set(self):
        if self._ipp is None:
            return None
        return next(iter(self._ipp.engines.values()), None)

    def _engine_output(self, lines: int = 40) -> str:
        return self.launcher.output(self._engine_set(), lines)

    def _wait_for_new_engines(self, old_pids: set[int]) -> None:
        assert self._client is not None
        infos = wait_for_engines(
            self._client,
            self.n,
            old_pids=old_pids,
            timeout=self.start_timeout,
            query=self._query_setup,
            ended=lambda: self.launcher.ended(self._engine_set()),
            output=self._engine_output,
            waiting=lambda: self.launcher.waiting(self._engine_set()),
            progress=_live_line,
        )
        ranks = sorted(info["rank"] for info in infos.values())
        if ranks != list(range(self.n)):
            raise ClusterError(
                f"Expected MPI ranks 0..{self.n - 1}, engines reported {ranks}: the engines "
                "did not form one MPI job (for Slurm, srun's --mpi=pmix must work)."
            )
        self._rank_info = {info["rank"]: {**info, "engine": eid} for eid, info in infos.items()}
        self._engine_of = {r: info["engine"] for r, info in self._rank_info.items()}

    def _query_setup(self, ids: list[int]) -> dict[int, dict] | None:
        assert self._client is not None
        try:
            ar = self._client[ids].apply_async(_engine_setup.setup, self._run_dir)
            results = ar.get(timeout=10)
        except (ipp.error.EngineError, ipp.error.TimeoutError, ipp.error.CompositeError):
            return None
        return dict(zip(ids, results))

    def stop(self) -> None:
        """Stop every rank and the controller; return once their processes are gone.

        Safe to call twice.
        """
        if not self.running:
            return
        self._teardown()

    def _teardown(self) -> None:
        guard = self._guard.pid if self._guard is not None else None
        procs = [p for p in map(_process, self.processes()) if p is not None and p.pid != guard]
        engine_set = self._engine_set()
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # the controller may already be gone
                pass
            self._client = None
        if self._ipp is not None:
            try:
                self._ipp.stop_cluster_sync()
                self.launcher.stopped(engine_set, timeout=30)
            finally:
                self._ipp = None
        # ipyparallel returns before the engines' nannies have exited
        psutil.wait_procs(procs, timeout=10)
        if self._guard is not None:
            self._guard.release()
            self._guard = None
        remove_run_dir(self._run_dir)
        self._run_dir = None
        self._rank_info = {}
        self._engine_of = {}
        self.dead = {}
        dash, self._dashboard = self._dashboard, None
        if dash is not None:  # after the ranks, so its last picture shows them stopped
            dash._cluster_stopped()

    def restart(self) -> None:
        """Stop all ranks (stuck ones included) and start a full set again.

        Engine state is lost: re-run imports and setup cells afterwards.
        """
        if not self.running:
            raise ClusterError("The cluster is not running; use start() (%mpi start).")
        assert self._ipp is not None
        old_pids = {info["pid"] for info in self._rank_info.values()}
        engine_set = self._engine_set()
        self._ipp.stop_engines_sync()
        self.launcher.stopped(engine_set, timeout=30)
        self._ipp.start_engines_sync(self.n)
        self._ipp.update_cluster_file()
        self._wait_for_new_engines(old_pids)
        self.lost = None
        self.dead = {}

    def mark_lost(self, why: str) -> None:
        """Record that the whole engine set is gone (until :meth:`restart`)."""
        self.lost = why

    # ------------------------------------------------------------------ ranks
    @property
    def client(self) -> ipp.Client:
        """The ipyparallel client (engine ids equal to ranks are not guaranteed)."""
        self._require_running()
        assert self._client is not None
        return self._client

    @property
    def ranks(self) -> list[int]:
        """Every rank of the job, dead ones (fault-tolerant jobs) included."""
        return sorted(self._engine_of)

    @property
    def live_ranks(self) -> list[int]:
        """The ranks cells run on by default: all but those that died."""
        self._note_lost_engines()
        return [r for r in self.ranks if r not in self.dead]

    def mark_dead(self, ranks: list[int], why: str) -> None:
        """Record ranks of a fault-tolerant job as dead (the job carries on)."""
        for r in ranks:
            self.dead.setdefault(r, why)

    def _note_lost_engines(self) -> None:
        # A rank that died between cells: its nanny has told the controller, which
        # unregistered the engine; the job itself lives on (fault-tolerant only).
        if not self.fault_tolerant or self._client is None:
            return
        ids = set(self._client.ids)
        gone = [r for r, eid in self._engine_of.items() if eid not in ids and r not in self.dead]
        self.mark_dead(gone, "its process exited between cells")

    def engine_id(self, rank: int) -> int:
        self._require_running()
        if rank in self.dead:
            raise ClusterError(
                f"Rank {rank} died ({self.dead[rank]}); ranks "
                f"{format_ranks(self.live_ranks)} still run. %mpi restart "
                "(cluster.restart()) brings back a full set."
            )
        try:
            return self._engine_of[rank]
        except KeyError:
            raise ValueError(f"Rank {rank} does not exist; ranks are 0..{self.n - 1}.") from None

    def rank_of(self, engine_id: int) -> int:
        for rank, eid in self._engine_of.items():
            if eid == engine_id:
                return rank
        raise KeyError(engine_id)

    def view(self, ranks: list[int] | None = None) -> ipp.DirectView:
        """A DirectView of the engines for ``ranks`` (default: live ones), in rank order."""
        ranks = self.live_ranks if ranks is None else list(ranks)
        return self.client[[self.engine_id(r) for r in ranks]]

    def _require_running(self) -> None:
        if not self.running:
            raise ClusterError("No MPI ranks are running. Start them with %mpi start -n 4.")
        if self.lost:
            raise ClusterError(f"{self.lost} Run %mpi restart (cluster.restart()).")

    # ------------------------------------------------------------------ status
    def status(self) -> list[dict]:
        """One dict per rank: rank, host, pid, state, cpu %, memory (MiB).

        CPU and memory are read for ranks on this machine; on other hosts they are None.
        """
        self._require_running()
        assert self._client is not None
        return self._status.rows(self._client, self._rank_info, self.multi_node)

    def processes(self) -> list[int]:
        """Pids of every local process of this cluster (controller, mpiexec, ranks...)."""
        pids: set[int] = set()
        if self._ipp is None:
            return []
        launchers = [self._ipp.controller, *self._ipp.engines.values()]
        for launcher in launchers:
            pid = getattr(launcher, "pid", None) if launcher is not None else None
            if not pid:
                continue
            try:
                proc = psutil.Process(pid)
                pids.add(pid)
                pids.update(c.pid for c in proc.children(recursive=True))
            except psutil.Error:
                pass
        if self._guard is not None:
            pids.add(self._guard.pid)
        return sorted(pids)

    # ------------------------------------------------------------------ data
    def push(self, namespace: dict, ranks: list[int] | None = None) -> None:
        """Copy ``namespace`` into every rank's globals (pickled, like ``%px`` push)."""
        self.view(ranks).push(namespace, block=True)

    def pull(self, name: str, ranks: list[int] | None = None) -> dict[int, Any]:
        """``{rank: value}`` of the global ``name`` on each (live) rank."""
        ranks = self.live_ranks if ranks is None else list(ranks)
        try:
            values = self.view(ranks).pull(name, block=True)
        except ipp.error.CompositeError as e:
            raise RankError(_failures_from_composite(self, e, ranks)) from None
        return dict(zip(ranks, values))

    # ------------------------------------------------------------------ run
    def run(
        self,
        code: str,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        block: bool = True,
        renderer=None,
        dashboard: bool = False,
    ) -> CellRun:
        """Run ``code`` on the ranks, streaming each rank's output; the call behind ``%%mpi``.

        Raises :class:`RankError` naming the failing ranks, and
        :class:`CellInterrupted` on a kernel interrupt or when ``timeout``
        (default: ``self.timeout``) passes; stuck ranks are reported with their
        stacks and freed, by a restart if nothing else works.

        With ``block=False`` returns a :class:`~clusterkernel.runner.CellRun` at
        once; call its ``wait()`` to stream and collect.

        ``dashboard=True`` (``%%mpi --dashboard``) shows :meth:`dashboard` first
        and, when the cell has run, collects its last records into it.
        """
        from clusterkernel.runner import CellRun

        self._require_running()
        ranks = self.live_ranks if ranks is None else sorted(set(ranks))
        for r in ranks:
            self.engine_id(r)  # clear error for a rank that does not exist
        dash = self.dashboard() if dashboard else None
        if dash is not None:
            dash.show()
        try:
            run = CellRun(self, code, ranks, renderer=renderer)
            if not block:
                return run
            return run.wait(timeout=self.timeout if timeout is None else timeout)
        finally:
            if dash is not None and block:
                dash.cell_finished()

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
        from clusterkernel.dashboard import Dashboard

        dash = self._dashboard
        if dash is None or dash.closed:
            return Dashboard(self)  # becomes this cluster's (_dashboard_streaming)
        dash.attach()  # after a restart the new ranks need their streams
        return dash

    def _dashboard_streaming(self, dash: Dashboard) -> None:
        """``dash`` now receives the ranks' records: it is this cluster's; an older one goes quiet."""
        old, self._dashboard = self._dashboard, dash
        if old is not None and old is not dash:
            old._quiet()

    def _dashboard_closed(self, dash: Dashboard) -> bool:
        """``dash`` is closing: True if it was this cluster's (it no longer is)."""
        if self._dashboard is not dash:
            return False
        self._dashboard = None
        return True

    # --------------------------------------------------------- fault handling
    def frames(self, ranks: list[int], with_locals: bool = False) -> dict[int, list[dict]]:
        """Each rank's main-thread frames, outermost first, while it runs a cell.

        Works while a rank is blocked inside an MPI call and for ranks on any host
        (the engine's control thread answers). A rank that cannot answer (its
        control thread starved by C code holding the GIL) is asked through
        ``faulthandler`` instead, if it runs on this machine; if neither works,
        it is missing from the result.
        """
        engines = {r: self.engine_id(r) for r in ranks}
        out = _stacks.request_frames(self.client, engines, with_locals=with_locals)
        missing = [r for r in ranks if r not in out]
        if missing:
            out.update(self._faulthandler_frames(missing))
        return out

    def stacks(
        self,
        ranks: list[int],
        code: str | None = None,
        with_locals: bool = False,
        all_frames: bool = False,
    ) -> dict[int, str]:
        """Each rank's stack as text, the cell's lines first (see :meth:`frames`).

        ``code`` (the cell's source) fills in the text of cell lines; clusterkernel's
        own frames show only with ``all_frames``.
        """
        found = self.frames(ranks, with_locals=with_locals)
        return {
            r: _stacks.format_stack(found[r], code, all_frames=all_frames, with_locals=with_locals)
            if r in found
            else "(no stack: the rank did not answer)"
            for r in ranks
        }

    def debug(self, ranks: list[int] | None = None, timeout: float = 10.0):
        """A :class:`~clusterkernel.debug.DebugSession`: pdb on ``ranks``, one command at a time.

        Each rank is debugged at its ``breakpoint()`` if a running cell stopped
        there, else post-mortem on its last failed cell. Default ranks: those at a
        breakpoint, else those with a traceback. ``timeout``: seconds a command may
        take before its answer says the rank runs on.

        Example::

            with cluster.debug(ranks=[1, 3]) as dbg:
                dbg.send("p x")      # {1: "10", 3: "30"}
        """
        from clusterkernel.debug import DebugSession

        self._require_running()
        return DebugSession(self, ranks, timeout=timeout)

    def _faulthandler_frames(self, ranks: list[int]) -> dict[int, list]:
        return _stacks.faulthandler_frames(
            self._run_dir or "", ranks, lambda rs: self.signal(_engine_setup.STACK_SIGNAL, rs)
        )

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        """Send ``sig`` to the given ranks only (through each engine's nanny)."""
        ranks = self.live_ranks if ranks is None else ranks
        self.client.send_signal(int(sig), targets=[self.engine_id(r) for r in ranks], block=True)

    def interrupt(self, ranks: list[int]) -> None:
        self.signal(signal.SIGINT, ranks)

    def dead_ranks(self) -> tuple[list[int], str] | None:
        """If the MPI job has ended, ``(ranks that died first, the launcher's report)``."""
        if not self.launcher.ended(self._engine_set()):
            return None
        report = job_report(self._engine_output(lines=200))
        return dead_ranks(report, self.n), report


def _failures_from_composite(cluster: Cluster, err, ranks):
    from clusterkernel.errors import group_failures

    items = []
    for ename, evalue, _tb, engine_info in err.elist:
        eid = (engine_info or {}).get("engine_id")
        try:
            rank = cluster.rank_of(eid)
        except KeyError:
            rank = -1
        # A failed pull is a missing or unpicklable name: the traceback would
        # only show ipyparallel's internals.
        items.append((rank, "error", f"{ename}: {evalue}", ""))
    return group_failures(items)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
