"""The processes of one running cluster, and how they start, restart and stop (client side).

:class:`Engines` owns what exists only while a cluster runs: the ipyparallel
cluster (controller and engine set), the client, the private run directory, the
guard process, and the rank -> engine map. ``Cluster.start`` makes one,
``Cluster.restart`` asks it for fresh ranks, ``Cluster.stop`` tears it down; nothing
else writes its fields. ipyparallel starts the controller and the engines through
the cluster's launcher; here they are waited for until every MPI rank answered
(fast, clear errors when the job fails to start), mapped rank -> engine, guarded
against a dying notebook, and stopped until no process of theirs is left.

Example::

    engines = Engines.start(launcher, env={}, log_level=logging.WARNING)
    engines.engine_of        # {0: 0, 1: 1, 2: 2, 3: 3}
    engines.restart()        # new rank processes, same controller
    engines.teardown()       # every process gone, the run directory removed
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import ipyparallel as ipp
import psutil

from clusterkernel.client._pids import CLUSTER_MARK, marked
from clusterkernel.client.cluster import _ipp
from clusterkernel.client.cluster._kept_login import local_copy
from clusterkernel.client.cluster._lost_replies import hold
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.launch import Launcher
from clusterkernel.client.launch._engine_wait import wait_for_engines
from clusterkernel.client.launch._guard import Guard, remote_cluster_file
from clusterkernel.client.launch._login_controller import LoginControllerLauncher
from clusterkernel.client.launch._run_dir import make_run_dir, private_cluster_file, remove_run_dir
from clusterkernel.client.launch._ssh import stable_context
from clusterkernel.protocol import _shm_names, _targets
from clusterkernel.protocol._procs import alive
from clusterkernel.protocol._rank_call import rank_call


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


def _steps(progress: Callable[[str | None], Any] | None) -> Callable[[str | None], None]:
    """``progress`` told each line once, and never None (or a no-op without it)."""
    last: list[str] = []

    def say(text: str | None) -> None:
        if progress is not None and text is not None and last[-1:] != [text]:
            last[:] = [text]
            progress(text)

    return say


class Engines:
    """The controller, engines, client, run directory and guard of a running cluster.

    Made by :meth:`start`; gone (every process stopped, the directory removed)
    after :meth:`teardown`. ``rank_info`` and ``engine_of`` are replaced whole by
    :meth:`restart`, never edited in place.
    """

    def __init__(self, launcher: Launcher, start_timeout: float) -> None:
        self.launcher = launcher
        self.start_timeout = start_timeout
        self.ipp: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.run_dir: str | None = None
        self.guard: Guard | None = None
        self.keeper: psutil.Process | None = None  # a kept cluster's guard, when attached
        self.rank_info: dict[int, dict] = {}  # rank -> {rank, host, pid, engine}
        self.engine_of: dict[int, int] = {}  # rank -> engine id
        # what this host's /dev/shm gained since then may be this cluster's (restart, stop)
        self._opened_at = time.time()

    @classmethod
    def start(
        cls,
        launcher: Launcher,
        env: dict[str, str],
        log_level: int = logging.WARNING,
        guard: bool = True,
        start_timeout: float = 90.0,
        keep: float | None = None,
        progress: Callable[[str | None], Any] | None = None,
    ) -> Engines:
        """Start the controller and the launcher's ``n`` ranks; on any failure nothing is
        left running. ``keep``: seconds the guard keeps them once this process is gone
        (``_kept_records``). ``progress``: told each new step of the start (never None: the
        caller ends its line, once the whole start is over)."""
        self = cls(launcher, start_timeout)
        n = self.n
        say = _steps(progress)
        _ipp.install_date_parser()  # less work per rank and cell (BENCHMARKS.md, "Scale")
        kwargs: dict[str, Any] = {}
        login = _login(launcher)  # from outside: the controller on the login node
        ip = launcher.controller_ip()  # may ask Slurm: before anything is made
        if ip:
            kwargs["controller_ip"] = ip
        if login is not None:
            kwargs["controller"] = LoginControllerLauncher
        self.run_dir = make_run_dir()
        try:
            self.ipp = ipp.Cluster(
                engines=launcher.engines(),
                n=n,
                profile_dir=self.run_dir,
                config=launcher.config({**env, CLUSTER_MARK: self.run_dir}, self.run_dir),
                log_level=log_level,
                log=_ipp_log(log_level),
                **kwargs,
            )
            if keep is not None:  # ipyparallel's own exit handler would stop it first
                self.ipp.shutdown_atexit = False
            say(f"Starting {n} MPI ranks: the controller")
            self.ipp.start_controller_sync()
            self.client = (
                self.ipp.connect_client_sync() if login is None else _tunnelled(self.ipp, login)
            )
            private_cluster_file(self.ipp)
            if guard and login is None:
                self.guard = Guard(self.ipp.cluster_file, self.run_dir, keep)
            say(f"Starting {n} MPI ranks: launching them ({launcher.describe()})")
            self.ipp.start_engines_sync(n)
            self.ipp.update_cluster_file()  # now with the job id, for the guard
            if guard and login is not None:  # it runs there, told the job by its file
                self.guard = self._guard_outside(login, keep)
            self._wait_for_new_engines(old_pids=set(), progress=say if progress else None)
        except BaseException:
            self.teardown()
            raise
        return self

    @classmethod
    def attach(
        cls, launcher: Launcher, run_dir: str, cluster_file: str, rank_info: dict,
        env: dict[str, str], keeper_pid: int | None = None, log_level: int = logging.WARNING,
        keep: float | None = None,
    ) -> Engines:  # fmt: skip
        """Connect to the running processes of a kept cluster (its guard keeps watching).
        From outside the cluster ``run_dir`` and ``cluster_file`` are the login node's, and
        this session's own guard there takes the keeper's place (``keep``: the cluster's
        keep time), so that a lost connection is made again as after a start."""
        self = cls(launcher, start_timeout=90.0)
        login = _login(launcher)
        if login is not None:  # its files here, where this session's ipyparallel reads them
            run_dir, cluster_file = local_copy(login, run_dir)
        self.run_dir = run_dir
        # with the launcher's configuration, so that a restart starts ranks as start() did
        self.ipp = ipp.Cluster.from_file(
            cluster_file,
            engines=launcher.engines(),
            config=launcher.config({**env, CLUSTER_MARK: run_dir}, run_dir),
            log=_ipp_log(log_level),
        )
        if login is None:
            self.client = self.ipp.connect_client_sync()
        else:  # the connection files, and the tunnels, as at the start
            self.ipp.controller.fetch_files()
            self.client = _tunnelled(self.ipp, login)
        self.rank_info = {int(r): info for r, info in rank_info.items()}
        self.engine_of = {r: info["engine"] for r, info in self.rank_info.items()}
        # from outside its keeper runs on the login node: no process of this machine's
        self.keeper = _process(keeper_pid) if keeper_pid and login is None else None
        try:
            self.client.wait_for_engines(len(self.engine_of), timeout=10)
        except (ipp.error.TimeoutError, ipp.error.EngineError, OSError):
            pass
        missing = sorted(set(self.engine_of.values()) - set(self.client.ids))
        try:
            if missing:
                raise ClusterError(
                    f"The kept cluster's engines {missing} did not register again within "
                    "10 s; %mpi list says what is left of it."
                )
            if login is not None:
                self.guard = self._guard_outside(login, keep)
        except BaseException:
            self.client.close()
            raise
        return self

    def _guard_outside(self, login, keep: float | None) -> Guard:
        """The guard on ``login`` of a cluster driven from outside: it makes a lost
        connection again, and the client's output and replies of the gap are recovered
        (``_lost_replies``)."""
        assert self.ipp is not None and self.run_dir is not None
        return Guard(
            self.ipp.cluster_file, self.run_dir, keep, login=login,
            on_lost=lambda: hold(self.client) if self.client is not None else None,
        )  # fmt: skip

    def detach(self) -> None:
        """Leave the processes running for the guard to keep; this object is done."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.guard is not None:
            self.guard.detach()
            self.guard = None
        self.keeper = None
        self.ipp = None  # shutdown_atexit is off: dropping it stops nothing
        self.run_dir = None
        self.rank_info = {}
        self.engine_of = {}

    # ------------------------------------------------------------------ reading
    @property
    def n(self) -> int:
        """The ranks it starts: the launcher's settings hold the count."""
        return self.launcher.n

    @property
    def engine_set(self):
        """ipyparallel's engine-set launcher (mpiexec, srun or the Slurm job), if any."""
        if self.ipp is None:
            return None
        return next(iter(self.ipp.engines.values()), None)

    @property
    def cluster_file(self) -> str | None:
        return self.ipp.cluster_file if self.ipp is not None else None

    def output(self, lines: int = 40) -> str:
        """The last ``lines`` of what the launcher (mpiexec, srun, the job) said."""
        return self.launcher.output(self.engine_set, lines)

    def ended(self) -> bool:
        """Whether the MPI job has ended (every rank gone)."""
        return self.launcher.ended(self.engine_set)

    def killed_by(self) -> int | None:
        """The signal that ended the launcher's own process (mpiexec), where one did."""
        return self.launcher.killed_by(self.engine_set)

    def processes(self) -> list[int]:
        """Pids of every local process (controller, mpiexec, ranks, guard)."""
        pids: set[int] = set()
        if self.ipp is None:
            return []
        # from outside, the controller's pid is the login node's: not a process here
        here = [] if _login(self.launcher) is not None else [self.ipp.controller]
        for launcher in [*here, *self.ipp.engines.values()]:
            pid = getattr(launcher, "pid", None) if launcher is not None else None
            if not pid:
                continue
            try:
                proc = psutil.Process(pid)
                pids.add(pid)
                pids.update(c.pid for c in proc.children(recursive=True))
            except psutil.Error:
                pass
        if self.guard is not None:
            pids.add(self.guard.pid)
        if self.keeper is not None and self.keeper.is_running():
            pids.add(self.keeper.pid)
        return sorted(pids)

    # ------------------------------------------------------------------ changing
    def restart(self) -> None:
        """Replace every rank by a new process (the controller stays)."""
        assert self.ipp is not None
        old_pids = {info["pid"] for info in self.rank_info.values()}
        engine_set = self.engine_set
        old_procs = _tree(getattr(engine_set, "pid", None))
        self.ipp.stop_engines_sync()
        self.launcher.stopped(engine_set, timeout=30)
        _end(old_procs, grace=_NANNY_GRACE)
        if self.run_dir:
            # ranks that outlived a crashed launcher are no longer in its tree; nor does a
            # launcher remove their segments
            spared = {x.pid for x in (self.guard, self.keeper) if x is not None}
            orphans = [p for p in marked(self.run_dir) if p.pid not in spared]
            segments = _shm_names.mapped_by([p.pid for p in orphans])
            _end(orphans, grace=0)
            _shm_names.remove_prefixed(segments)
            # the old job's segments: its prterun was stopped, not left to end
            _shm_names.remove(self.run_dir)
            _shm_names.remove_unmapped(self._opened_at)  # a rank's that died unnoted
        self.ipp.start_engines_sync(self.n)
        self.ipp.update_cluster_file()
        login = _login(self.launcher)
        if login is not None and self.run_dir:  # the guard's copy there: the new job's
            remote_cluster_file(login, self.ipp.cluster_file, self.run_dir)
        self._wait_for_new_engines(old_pids)

    def respawned(self, engine_ids: list[int]) -> None:
        """The engines ``engine_ids`` registered again as new processes of their old ranks
        (``Cluster.respawn``): read their identity into the rank map."""
        infos = self._query_setup(engine_ids)
        if infos is None:
            raise ClusterError(f"The respawned engines {engine_ids} did not answer their set-up.")
        for eid, info in infos.items():
            self.rank_info[info["rank"]] = {**info, "engine": eid}
            self.engine_of[info["rank"]] = eid

    def _wait_for_new_engines(
        self, old_pids: set[int], progress: Callable[[str | None], Any] | None = None
    ) -> None:
        """Wait for ``n`` new ranks; ``progress`` told every change (else a live line once
        the wait is long)."""
        assert self.client is not None
        infos = wait_for_engines(
            self.client,
            self.n,
            old_pids=old_pids,
            timeout=self.start_timeout,
            query=self._query_setup,
            ended=self.ended,
            output=self.output,
            waiting=lambda: self.launcher.waiting(self.engine_set),
            progress=progress or _live_line,
            say_after=0.0 if progress else None,
        )
        ranks = sorted(info["rank"] for info in infos.values())
        if ranks != list(range(self.n)):
            raise ClusterError(
                f"Expected MPI ranks 0..{self.n - 1}, engines reported {ranks}: the engines "
                "did not form one MPI job (for Slurm, srun's --mpi=pmix must work)."
            )
        self.rank_info = {info["rank"]: {**info, "engine": eid} for eid, info in infos.items()}
        self.engine_of = {r: info["engine"] for r, info in self.rank_info.items()}

    def _query_setup(self, ids: list[int]) -> dict[int, dict] | None:
        # No collective in the set-up: a poll may reach some new engines and not others.
        assert self.client is not None
        try:
            # the ranks see the cluster's directory where they run (the login node's, from outside)
            where = getattr(self.launcher, "remote_dir", lambda d: d)(self.run_dir)
            ar = self.client[ids].apply_async(rank_call, _targets.ENGINE_SETUP, where)
            results = ar.get(timeout=10)
        except (ipp.error.EngineError, ipp.error.TimeoutError, ipp.error.CompositeError):
            return None
        return dict(zip(ids, results))

    def teardown(self) -> None:
        """Stop every process and return once they are gone; remove the run directory."""
        # the guard is released below, and a keeper leaves by itself: neither is ended here
        spared = {x.pid for x in (self.guard, self.keeper) if x is not None}
        procs = [
            p for p in map(_process, self.processes()) if p is not None and p.pid not in spared
        ]
        nannies = [p for p in procs if _is_nanny(p)]  # named while they still run
        # the job's segments as its ranks map them now (a rank noted its own at set-up,
        # perhaps before Open MPI made them all): a scheduler's cancel kills prterun
        ours = [p.pid for p in procs] + (
            [p.pid for p in marked(self.run_dir)] if self.run_dir else []
        )
        segments = _shm_names.mapped_by(ours)
        engine_set = self.engine_set
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # the controller may already be gone
                pass
            self.client = None
        if self.ipp is not None:
            try:
                self.ipp.stop_cluster_sync()
                self.launcher.stopped(engine_set, timeout=30)
            finally:
                self.ipp = None
        # With the controller stopped, a nanny's last act (telling it that its engine is
        # gone) waits out its socket's linger for no one, which made most of a stop's time
        # (BENCHMARKS.md, "Start and cells", the stop).
        others = [p for p in procs if p not in nannies]
        _end(others, grace=_NANNY_GRACE)
        _end(nannies, grace=0)
        if self.run_dir:  # what the launchers' trees no longer reach (an orphaned nanny)
            _end(marked(self.run_dir), grace=0)
        if self.guard is not None:
            self.guard.release()
            self.guard = None
        if self.keeper is not None:  # it leaves once it sees the cluster file gone
            _wait_gone([self.keeper], timeout=10)
            self.keeper = None
        if self.run_dir:
            # prterun removes the job's shared-memory segments, but not a rank's whose
            # process was SIGKILLed (the out-of-memory killer): the names the ranks noted
            _shm_names.remove(self.run_dir)
            _shm_names.remove_unmapped(self._opened_at)
        _shm_names.remove_prefixed(segments)
        login = _login(self.launcher)
        if login is not None and self.run_dir:  # what the cluster wrote on the login node
            try:
                login.remove(login.home_path(self.run_dir))
            finally:
                login.close()
        remove_run_dir(self.run_dir)
        self.run_dir = None
        self.rank_info = {}
        self.engine_of = {}


def _tunnelled(cluster: ipp.Cluster, login) -> ipp.Client:
    """A client of ``cluster``'s controller on the login node, its ports forwarded here
    through the login's master connection (``Login.forwarded``)."""
    with open(cluster.controller.connection_files["client"]) as f:
        info = login.forwarded(json.load(f))
    return ipp.Client(
        info, cluster=cluster, profile_dir=cluster.profile_dir,
        cluster_id=cluster.cluster_id, timeout=30, context=stable_context(),
    )  # fmt: skip


def _login(launcher: Launcher):
    """The login node a launcher starts from outside the cluster (None: here)."""
    return getattr(launcher, "login", None)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    """Return once every process in ``procs`` has exited (or ``timeout`` passed).

    Not ``psutil.wait_procs``: a process that is not our child stays a zombie until its
    own parent reaps it (a kept cluster's guard, whose parent is the session that started
    it), and ``wait_procs`` would wait the whole timeout for it.
    """
    deadline = time.monotonic() + timeout
    left = list(procs)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.05)
    psutil.wait_procs(procs, timeout=0)  # reaps those that are our children


# ipyparallel returns from a stop before the engines' nannies have exited. A nanny
# tells the controller its engine is gone (3 s at most), then ends its zmq context,
# which waits without limit for a reply it relays to a controller that has already
# stopped: seen once in a CI run, a nanny that outlived every later test.
_NANNY_GRACE = 5.0


def _end(procs: list[psutil.Process], grace: float) -> None:
    """Give ``procs`` ``grace`` s to exit by themselves, then terminate (and kill) the rest."""
    _wait_gone(procs, timeout=grace)
    left = [p for p in procs if alive(p)]
    for sig in ("terminate", "kill"):
        for proc in left:
            try:
                getattr(proc, sig)()
            except psutil.Error:
                pass
        _wait_gone(left, timeout=2)
        left = [p for p in left if alive(p)]
        if not left:
            return


def _is_nanny(proc: psutil.Process) -> bool:
    """Whether ``proc`` is an engine's ipyparallel nanny (the engine's signal relay)."""
    try:
        return "ipyparallel.engine.nanny" in proc.cmdline()
    except psutil.Error:
        return False


def _tree(pid: int | None) -> list[psutil.Process]:
    """``pid``'s process and all its descendants (none if it is gone)."""
    proc = _process(pid) if pid else None
    if proc is None:
        return []
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
