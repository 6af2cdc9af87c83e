"""An MPI engine set: ipyparallel engines launched by mpiexec, one per rank (client side).

:class:`Cluster` wraps ``ipyparallel.Cluster(engines="mpi")``: ipyparallel owns the
controller, the processes and the transport; this class adds what a notebook user
of an MPI job needs on top: finding and configuring ``mpiexec``, the engine-id to
rank map, fast and clear start-up errors, status per rank, a guard process that
stops the cluster if the notebook kernel dies, and :meth:`run`, the call behind
``%%mpi``.

Example::

    from clusterkernel import Cluster
    with Cluster(n=4) as cluster:
        cluster.run("from clusterkernel import comm; print(comm.rank())")
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import ipyparallel as ipp
import psutil
from traitlets.config import Config

from clusterkernel import _engine_setup
from clusterkernel.errors import CellInterrupted, ClusterError, RankError, format_ranks
from clusterkernel.mpiexec import (
    MPIRuntime,
    check_hosts_resolve,
    is_local_only,
    parse_hosts,
)

__all__ = ["Cluster", "ClusterError", "RankError", "CellInterrupted"]

# A single-machine job has no reason to be reachable from the network: ranks talk
# through shared memory, so Open MPI's TCP transport (which listens on every
# interface) is switched off. Open MPI 5's launcher daemon (prterun) still opens
# an out-of-band port on all interfaces; PRRTE refuses a loopback-only setting.
_LOCAL_ONLY_ENV = {"OMPI_MCA_btl": "self,sm"}


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


class Cluster:
    """Start, watch and stop ``n`` MPI ranks as ipyparallel engines.

    Parameters
    ----------
    n : number of MPI ranks (>= 1).
    hosts : ``"a:2,b:2"`` (host:slots) for several machines; implies the
        controller listens on all interfaces. Default: this machine only, and
        everything listens on loopback.
    hostfile : an MPI hostfile instead of ``hosts``.
    mpiexec : path to ``mpiexec``; default: next to ``sys.executable``, then PATH.
    env : extra environment variables for the ranks (e.g. ``OMP_NUM_THREADS``).
    timeout : default watchdog for :meth:`run` in seconds (None: no watchdog).
    start_timeout : seconds to wait for all engines to register.
    fault_tolerant : keep the job running when a rank dies (Open MPI's ULFM):
        the cell reports the dead rank, later cells run on the others, and
        :meth:`restart` brings back a full set. Default: a dead rank ends the job.

    Example::

        cluster = Cluster(n=2).start()
        cluster.run("print('hi')")      # [rank 0] hi / [rank 1] hi
        cluster.stop()
    """

    def __init__(
        self,
        n: int = 4,
        hosts: str | list[str] | None = None,
        hostfile: str | None = None,
        mpiexec: str | None = None,
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        start_timeout: float = 90.0,
        guard: bool = True,
        log_level: int = logging.WARNING,
        fault_tolerant: bool = False,
    ) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive integer number of ranks, got {n!r}.")
        if hosts and hostfile:
            raise ValueError("Give either hosts= or hostfile=, not both.")
        if hostfile and not os.path.isfile(hostfile):
            raise FileNotFoundError(f"Hostfile {hostfile!r} does not exist.")
        self.n = n
        self.hosts = parse_hosts(hosts)
        check_hosts_resolve(self.hosts)
        self.hostfile = hostfile
        self.runtime = MPIRuntime.detect(mpiexec)
        self.multi_node = bool(hostfile) or not is_local_only(self.hosts)
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
        self._procs: dict[int, psutil.Process] = {}  # pid -> process, for CPU %
        self._stack_dir: str | None = None
        self._guard_proc: subprocess.Popen | None = None
        self.lost: str | None = None  # why the engine set is gone, if it is
        self.dead: dict[int, str] = {}  # rank -> how it died (fault-tolerant jobs)

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<clusterkernel.Cluster n={self.n} {self.runtime.flavor} {state}>"

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._ipp is not None

    def _config(self) -> Config:
        cfg = Config()
        # Only what we add: ipyparallel lays it over our own environment. PATH is
        # extended, not replaced, or the ranks (and mpiexec's ssh) lose /usr/bin.
        base = {"PATH": os.environ.get("PATH", "")}
        env = {**self.runtime.env(base, fault_tolerant=self.fault_tolerant), **self.env}
        if not self.multi_node:
            for key, value in _LOCAL_ONLY_ENV.items():
                env.setdefault(key, value)
        # Figures made on a rank are sent to the notebook when shown.
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        launcher = cfg.MPIEngineSetLauncher
        launcher.mpi_cmd = [self.runtime.mpiexec]
        launcher.mpi_args = self.runtime.args(
            self.n, hosts=self.hosts, hostfile=self.hostfile, fault_tolerant=self.fault_tolerant
        )
        launcher.environment = env
        launcher.engine_args = ["--log-level=WARN"]
        cfg.LocalControllerLauncher.controller_args = ["--log-level=WARN"]
        return cfg

    def start(self) -> Cluster:
        """Start the controller and ``n`` ranks; return ``self``.

        Raises :class:`ClusterError` at once (with mpiexec's output) if the
        engines fail to start, instead of waiting out ``start_timeout``.
        """
        if self.running:
            raise ClusterError(
                "This cluster is already running. Use restart() (%mpi restart) or stop() first."
            )
        self.lost = None
        kwargs: dict[str, Any] = {}
        if self.multi_node:
            kwargs["controller_ip"] = "*"
        self._ipp = ipp.Cluster(
            engines="mpi",
            n=self.n,
            config=self._config(),
            log_level=self.log_level,
            log=_ipp_log(self.log_level),
            **kwargs,
        )
        self._stack_dir = tempfile.mkdtemp(prefix="clusterkernel-stacks-")
        try:
            self._ipp.start_controller_sync()
            self._client = self._ipp.connect_client_sync()
            self._start_guard()
            self._ipp.start_engines_sync(self.n)
            self._wait_for_new_engines(old_pids=set())
        except BaseException:
            self._teardown()
            raise
        return self

    def _engine_set(self):
        assert self._ipp is not None
        return next(iter(self._ipp.engines.values()), None)

    def _mpiexec_exited(self) -> bool:
        """Whether mpiexec (so the whole engine set) has exited.

        Asks the OS rather than the launcher: the launcher learns of the exit only
        when ipyparallel's event loop next runs, which a blocked notebook never lets it.
        """
        proc = getattr(self._engine_set(), "process", None)
        if proc is None:
            return False
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def _engine_output(self, lines: int = 40) -> str:
        es = self._engine_set()
        out = es.get_output() if es is not None else ""
        return "\n".join(out.rstrip().splitlines()[-lines:])

    def _wait_for_new_engines(self, old_pids: set[int]) -> None:
        """Wait until ``n`` engines answer that were not there before, then map ranks.

        Restarted engines take the old engine ids, so counting ids is not enough:
        an answer from a new pid is.
        """
        assert self._client is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._mpiexec_exited():
                raise ClusterError(
                    f"The MPI engines failed to start. Their output:\n{self._engine_output()}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"Only {len(self._client.ids)} of {self.n} engines registered within "
                    f"{self.start_timeout:.0f}s. Their output so far:\n{self._engine_output()}"
                )
            ids = list(self._client.ids)
            if len(ids) >= self.n:
                infos = self._query_setup(ids)
                if infos and all(i["pid"] not in old_pids for i in infos.values()):
                    self._set_rank_map(infos)
                    return
            time.sleep(0.05)

    def _query_setup(self, ids: list[int]) -> dict[int, dict] | None:
        assert self._client is not None
        try:
            ar = self._client[ids].apply_async(_engine_setup.setup, self._stack_dir)
            results = ar.get(timeout=10)
        except (ipp.error.EngineError, ipp.error.TimeoutError, ipp.error.CompositeError):
            return None
        return dict(zip(ids, results))

    def _set_rank_map(self, infos: dict[int, dict]) -> None:
        ranks = sorted(info["rank"] for info in infos.values())
        if ranks != list(range(self.n)):
            raise ClusterError(f"Expected MPI ranks 0..{self.n - 1}, engines reported {ranks}.")
        self._rank_info = {info["rank"]: {**info, "engine": eid} for eid, info in infos.items()}
        self._engine_of = {r: info["engine"] for r, info in self._rank_info.items()}

    def _start_guard(self) -> None:
        """Start a watcher that stops this cluster if our process dies (even SIGKILL)."""
        assert self._ipp is not None
        self._ipp.update_cluster_file()
        # ipyparallel writes it with the umask's mode; it names every process and
        # the connection files, so keep it to the user (rewrites keep the mode).
        os.chmod(self._ipp.cluster_file, 0o600)
        if not self.guard:
            return
        # The watcher sees EOF on its stdin when we die, whatever killed us.
        self._guard_proc = subprocess.Popen(
            [sys.executable, "-m", "clusterkernel._guard", self._ipp.cluster_file],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not reach it
        )

    def _stop_guard(self) -> None:
        if self._guard_proc is None:
            return
        try:
            self._guard_proc.stdin.write(b"stopped\n")
            self._guard_proc.stdin.close()
        except OSError:
            pass
        try:
            self._guard_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._guard_proc.kill()
        self._guard_proc = None

    def stop(self) -> None:
        """Stop every rank and the controller. Safe to call twice."""
        if not self.running:
            return
        self._teardown()

    def _teardown(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # the controller may already be gone
                pass
            self._client = None
        if self._ipp is not None:
            try:
                self._ipp.stop_cluster_sync()
            finally:
                self._ipp = None
        self._stop_guard()
        self._rank_info = {}
        self._engine_of = {}
        self.dead = {}

    def restart(self) -> None:
        """Stop all ranks (stuck ones included) and start a full set again.

        Engine state is lost: re-run imports and setup cells afterwards.
        """
        if not self.running:
            raise ClusterError("The cluster is not running; use start() (%mpi start).")
        assert self._ipp is not None
        old_pids = {info["pid"] for info in self._rank_info.values()}
        self._ipp.stop_engines_sync()
        self._ipp.start_engines_sync(self.n)
        self._wait_for_new_engines(old_pids)
        self.lost = None
        self.dead = {}

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
        """One dict per rank: rank, host, pid, state, cpu %, memory (MiB)."""
        self._require_running()
        assert self._client is not None
        queue = self._client.queue_status(verbose=True)
        busy = _busy_engines(queue, self._client.session.session + "_", self._client.outstanding)
        rows = []
        for rank in self.ranks:
            info = self._rank_info[rank]
            eid = info["engine"]
            q = queue.get(eid)
            state = "dead"
            cpu = mem = None
            if q is not None:
                state = "busy" if eid in busy else "idle"
            try:
                # Kept between calls: cpu_percent() measures since the previous call
                # on the same object (a fresh one always says 0).
                proc = self._procs.get(info["pid"]) or psutil.Process(info["pid"])
                self._procs[info["pid"]] = proc
                with proc.oneshot():
                    mem = proc.memory_info().rss / 2**20
                    cpu = proc.cpu_percent(interval=None)
            except psutil.Error:
                if not self.multi_node:
                    state = "dead"
            rows.append(
                {
                    "rank": rank,
                    "host": info["host"],
                    "pid": info["pid"],
                    "state": state,
                    "cpu": cpu,
                    "memory_mib": mem,
                }
            )
        return rows

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
        if self._guard_proc is not None:
            pids.add(self._guard_proc.pid)
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
    ):
        """Run ``code`` on the ranks, streaming each rank's output; the call behind ``%%mpi``.

        Raises :class:`RankError` naming the failing ranks, and
        :class:`CellInterrupted` on a kernel interrupt or when ``timeout``
        (default: ``self.timeout``) passes; stuck ranks are reported with their
        stacks and freed, by a restart if nothing else works.

        With ``block=False`` returns a :class:`~clusterkernel.runner.CellRun` at
        once; call its ``wait()`` to stream and collect.
        """
        from clusterkernel.runner import CellRun

        self._require_running()
        ranks = self.live_ranks if ranks is None else sorted(set(ranks))
        for r in ranks:
            self.engine_id(r)  # clear error for a rank that does not exist
        run = CellRun(self, code, ranks, renderer=renderer)
        if not block:
            return run
        return run.wait(timeout=self.timeout if timeout is None else timeout)

    # --------------------------------------------------------- fault handling
    def stacks(self, ranks: list[int], settle: float = 0.3) -> dict[int, str]:
        """Python stacks of ``ranks``, even when blocked inside MPI (local hosts only)."""
        assert self._stack_dir is not None
        offsets = {}
        for r in ranks:
            path = _engine_setup.stack_path(self._stack_dir, r)
            offsets[r] = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            self.signal(_engine_setup.STACK_SIGNAL, ranks)
        except Exception:
            return {}
        time.sleep(settle)
        out = {}
        for r in ranks:
            path = _engine_setup.stack_path(self._stack_dir, r)
            try:
                with open(path) as f:
                    f.seek(offsets[r])
                    out[r] = _main_thread_stack(f.read())
            except OSError:
                out[r] = "(stack not available: rank on another host)"
        return out

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        """Send ``sig`` to the given ranks only (through each engine's nanny)."""
        ranks = self.live_ranks if ranks is None else ranks
        self.client.send_signal(int(sig), targets=[self.engine_id(r) for r in ranks], block=True)

    def interrupt(self, ranks: list[int]) -> None:
        self.signal(signal.SIGINT, ranks)

    def dead_ranks(self) -> tuple[list[int], str] | None:
        """If the MPI job has ended, ``(ranks that died first, mpiexec's report)``."""
        if not self._mpiexec_exited():
            return None
        report = _mpi_report(self._engine_output(lines=200))
        return _parse_dead_ranks(report, self.n), report


def _busy_engines(queue: dict, ours: str, outstanding: set[str]) -> set[int]:
    """Engines with a task still running or queued, from a verbose queue status.

    The controller books a task as done some time after its reply has reached
    the client (seconds, on a loaded machine), so for this client's own tasks
    (message ids starting with its session id, ``ours``) the client's own
    ``outstanding`` set decides; tasks of other clients count as the
    controller says.
    """
    busy = set()
    for eid, q in queue.items():
        if isinstance(q, dict) and any(
            m in outstanding or not m.startswith(ours)
            for m in (*q.get("queue", ()), *q.get("tasks", ()))
        ):
            busy.add(eid)
    return busy


def _main_thread_stack(dump: str) -> str:
    """The main thread's frames from a faulthandler dump, user code only.

    The main thread runs the cell; frames below IPython's ``run_code`` are the
    engine's own machinery and are dropped.
    """
    blocks = [b for b in dump.strip().split("\n\n") if b.strip()]
    main = next((b for b in blocks if "interactiveshell.py" in b), blocks[-1] if blocks else "")
    lines = []
    for line in main.splitlines():
        if "IPython/core/interactiveshell.py" in line:
            break
        lines.append(line)
    return "\n".join(lines)


def _mpi_report(output: str) -> str:
    """MPI's own message from the launcher's log (its ``----`` boxed blocks)."""
    blocks = re.findall(r"^-{20,}\n(.*?)^-{20,}$", output, flags=re.S | re.M)
    if blocks:
        return "\n".join(b.strip() for b in blocks)
    lines = [ln for ln in output.splitlines() if "[KernelNanny" not in ln and "[IPEngine" not in ln]
    return "\n".join(lines[-20:]) or "mpiexec exited without a message."


def _parse_dead_ranks(report: str, n: int) -> list[int]:
    found = set()
    for pat in (
        r"rank\s+(\d+)\s+with\s+PID",  # prterun: "process rank 2 with PID ..."
        r"Process name: \[[^,\]]+,(\d+)\]",  # prterun: non-zero exit status
        r"\[proxy:[^\]]*\] .*rank (\d+)",  # hydra
    ):
        found.update(int(m) for m in re.findall(pat, report))
    return sorted(r for r in found if r < n)


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
