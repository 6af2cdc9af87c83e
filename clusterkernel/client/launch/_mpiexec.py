"""How an engine set comes up and goes down (client side).

:class:`Cluster` asks a *launcher* (the :class:`Launcher` protocol) for the ipyparallel
configuration that starts the engines, the controller's address, whether the engine
set waits in a queue or has ended, what its launcher said, and to wait for a cancelled
job's processes to go. Two launchers sit side by side:

- :class:`MpiexecLauncher`: ``mpiexec`` on this machine or a host list
  (ipyparallel's ``MPIEngineSetLauncher``);
- :class:`clusterkernel.client.cluster._batch.BatchLauncher`: a job of a batch scheduler
  (:mod:`clusterkernel.client.scheduler`: Slurm, Grid Engine), or a job step (``srun``)
  when the notebook already runs inside a Slurm allocation.

Around them, what every launcher needs: a private directory for the cluster's
files, the guard process that stops the cluster if the notebook dies, and the wait
for ``n`` fresh engines.

Each launcher is built once from a
:class:`~clusterkernel.client.cluster._launch_settings.LaunchSettings` and keeps it.

Example::

    launcher = LaunchSettings(n=4).build()      # an MpiexecLauncher
    cfg = launcher.config(env={}, run_dir=make_run_dir())
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import ipyparallel as ipp
import psutil
from ipyparallel.cluster.launcher import ipengine_cmd_argv
from traitlets.config import Config

from clusterkernel.client.cluster._launch_settings import DEFAULT_RANKS
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.mpiexec import MPIRuntime, check_hosts_resolve, is_local_only, parse_hosts
from clusterkernel.protocol._names import PREIMPORT

if TYPE_CHECKING:
    from clusterkernel.client.cluster._launch_settings import LaunchSettings

# An engine counts as registered once the controller has seen its heartbeat; at
# ipyparallel's default period (3 s) that alone costs 1.5 s on average per start.
HEARTBEAT_MS = 500

# A start taking longer than this (4 ranks take ~7 s here, 32 ~17 s) says how many
# engines have registered so far, on a live line.
_SAY_PROGRESS_AFTER = 20.0

# Where clusters keep their files: the user's home, which compute nodes of a
# cluster usually share (engines there read their connection file), and never the
# default IPython profile, whose clusters Jupyter's ipyparallel extension adopts.
RUN_ROOT_ENV = "CLUSTERKERNEL_RUN_DIR"

# Ranks per core one machine is allowed before a start is refused: 32 ranks ran on the
# 2-core test machine (BENCHMARKS.md, issue 11); 100,000 took 108 s to fail there.
MAX_RANKS_PER_CORE_ENV = "CLUSTERKERNEL_MAX_RANKS_PER_CORE"
_MAX_RANKS_PER_CORE = 32


def local_rank_limit() -> int:
    """The most ranks a start on this machine alone may ask for (cores x the per-core cap)."""
    per_core = int(os.environ.get(MAX_RANKS_PER_CORE_ENV) or _MAX_RANKS_PER_CORE)
    return (os.cpu_count() or 1) * per_core


class Launcher(Protocol):
    """What :class:`~clusterkernel.Cluster` needs from a way of starting engines.

    ``engine_set`` below is ipyparallel's engine-set launcher this one configured (None
    before a start). Cancelling a job is the engine set's ``stop()`` (a scheduler's
    class runs the command); the launcher says when its processes are gone.
    """

    kind: str  # "mpiexec" or a scheduler's name ("slurm", "sge")
    # what it was built from, the rank count filled in (a kept cluster's record)
    settings: LaunchSettings
    multi_node: bool  # ranks may run on other machines: the controller listens for them

    @property
    def n(self) -> int:
        """The ranks it starts: ``settings.n``, the one place the count is held."""
        ...

    def engines(self) -> str | type:
        """ipyparallel's engine launcher: its name or class."""
        ...

    def controller_ip(self) -> str | None:
        """The address the controller listens on (None: ipyparallel's default, local)."""
        ...

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        """ipyparallel's configuration that starts the ranks with ``env`` added."""
        ...

    def ended(self, engine_set) -> bool:
        """Whether the ranks' job (or mpiexec) has ended."""
        ...

    def output(self, engine_set, lines: int = 40) -> str:
        """The last ``lines`` of what the launcher (mpiexec, the job) said."""
        ...

    def waiting(self, engine_set) -> str | None:
        """Why no rank can come yet (a job waiting in the queue), else None."""
        ...

    def stopped(self, engine_set, timeout: float) -> None:
        """After a stop: wait (up to ``timeout``) until the job's processes are gone."""
        ...

    def describe(self) -> str:
        """How the ranks run, in a word or two (``"openmpi"``, ``"slurm step"``)."""
        ...


def engine_cmd(env: dict[str, str]) -> list[str]:
    """ipyparallel's engine command for ranks started with ``env``: through
    :mod:`clusterkernel.rank._warm_start` where ``env`` names modules to import while
    the engine registers (``--torch``: torch.distributed), else ipyparallel's own."""
    if env.get(PREIMPORT):
        return [sys.executable, "-m", "clusterkernel.rank._warm_start"]
    return list(ipengine_cmd_argv)


def _base_config() -> Config:
    cfg = Config()
    cfg.LocalControllerLauncher.controller_args = [
        "--log-level=WARN",
        f"--HeartMonitor.period={HEARTBEAT_MS}",
    ]
    return cfg


class MpiexecLauncher:
    """Engines started by ``mpiexec`` here or on a host list, as ``settings`` say.

    Refuses, before anything starts, what ``mpiexec`` cannot do with them: a
    scheduler's options, more ranks than the hosts' slots, an unknown host, more ranks than this
    machine alone takes.

    Example::

        launcher = MpiexecLauncher(LaunchSettings(n=4, hosts="a:2,b:2"))
        launcher.multi_node          # True: the controller listens for other machines
    """

    kind = "mpiexec"

    def __init__(self, settings: LaunchSettings) -> None:
        if settings.options():
            from clusterkernel.client import scheduler

            given = settings.options()
            owners = sorted({s.name for k in given for s, _ in scheduler.options()[k]})
            raise ValueError(
                f"{', '.join(k + '=' for k in given)} are for "
                + " or ".join(f"launcher='{o}'" for o in owners)
                + "."
            )
        hosts = parse_hosts(settings.hosts)
        slots = [count for _, count in hosts]
        n = settings.n or DEFAULT_RANKS
        if settings.n is not None and hosts and all(slots) and n > sum(slots):
            raise ValueError(
                f"{n} ranks, but hosts= gives {sum(slots)} slots "
                f"({', '.join(f'{h}:{c}' for h, c in hosts)}): ask for at most {sum(slots)} "
                "ranks, or give the hosts more slots."
            )
        check_hosts_resolve(hosts)
        self.settings = settings.with_ranks(n)
        self.runtime = MPIRuntime.detect(settings.mpiexec)
        self.hosts = hosts
        self.hostfile = settings.hostfile
        self.fault_tolerant = settings.fault_tolerant
        self.multi_node = bool(self.hostfile) or not is_local_only(self.hosts)
        limit = local_rank_limit()
        if not self.multi_node and self.n > limit:
            cores = os.cpu_count() or 1
            raise ValueError(
                f"{self.n} ranks on this machine alone: at most {limit} "
                f"({os.cpu_count()} cores x {limit // cores}) are started here. "
                f"Ask for fewer, spread them with hosts=/--hosts or a scheduler, or raise the cap with "
                f"{MAX_RANKS_PER_CORE_ENV}."
            )
        self._controller_ip = settings.controller_ip

    @property
    def n(self) -> int:
        return self.settings.n

    def engines(self) -> str:
        return "mpi"

    def controller_ip(self) -> str | None:
        if self._controller_ip is not None:
            return self._controller_ip
        return "*" if self.multi_node else None

    def describe(self) -> str:
        return self.runtime.flavor

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        cfg = _base_config()
        # Only what we add: ipyparallel lays it over our own environment. PATH is
        # extended, not replaced, or the ranks (and mpiexec's ssh) lose /usr/bin.
        full = {
            **self.runtime.env(
                {"PATH": os.environ.get("PATH", "")},
                fault_tolerant=self.fault_tolerant,
                hosts=self.hosts,
                hostfile=self.hostfile,
            ),
            **env,
        }
        launcher = cfg.MPIEngineSetLauncher
        launcher.mpi_cmd = [self.runtime.mpiexec]
        launcher.mpi_args = self.runtime.args(  # ipyparallel adds -n: its n is self.n
            hosts=self.hosts, hostfile=self.hostfile, fault_tolerant=self.fault_tolerant
        )
        launcher.environment = full
        launcher.engine_cmd = engine_cmd(full)
        launcher.engine_args = ["--log-level=WARN"]
        return cfg

    def ended(self, engine_set) -> bool:
        return process_ended(engine_set)

    def output(self, engine_set, lines: int = 40) -> str:
        return tail(current_output(engine_set), lines)

    def waiting(self, engine_set) -> str | None:
        return None

    def stopped(self, engine_set, timeout: float) -> None:
        return None


def current_output(engine_set) -> str:
    """What a launcher has written so far: its file read now (ipyparallel's
    ``get_output`` keeps the first read, stale while a fault-tolerant job runs on)."""
    if engine_set is None:
        return ""
    path = getattr(engine_set, "output_file", None)
    if path:
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            pass
    return engine_set.get_output()


def tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of a launcher's output."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def process_ended(engine_set) -> bool:
    """Whether a launcher's process (mpiexec, srun) has exited.

    Asks the OS rather than the launcher: the launcher learns of the exit only
    when ipyparallel's event loop next runs, which a blocked notebook never lets it.
    """
    proc = getattr(engine_set, "process", None)
    if proc is None:
        return False
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


# ---------------------------------------------------------------- files
def make_run_dir() -> str:
    """A new directory for one cluster's files, readable by the user alone.

    Named ``cluster-<6 digits>``: the digits are the id a kept cluster is attached by
    (``%mpi attach 482913``), short enough to type."""
    root = os.environ.get(RUN_ROOT_ENV) or os.path.join(
        os.path.expanduser("~"), ".clusterkernel", "clusters"
    )
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        while True:  # mkdir is atomic: a name another start took is simply tried again
            path = os.path.join(root, f"cluster-{secrets.randbelow(900_000) + 100_000}")
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                continue
    except OSError:  # a read-only home: the machine's temp directory
        path = tempfile.mkdtemp(prefix="clusterkernel-")
    os.chmod(path, 0o700)
    return path


def remove_run_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- guard
class Guard:
    """A watcher process that stops the cluster if this process dies (even SIGKILL).

    It holds the read end of a pipe; EOF without a final ``stopped`` line means we
    died. It then stops every process in the cluster file, cancels its batch jobs
    and removes the run directory (``clusterkernel.client.cluster._guard``).
    """

    def __init__(self, cluster_file: str, run_dir: str, keep: float | None = None) -> None:
        # keep: seconds (inf: until stopped) the guard keeps the cluster once we are gone
        args = [cluster_file, run_dir] + ([repr(float(keep))] if keep is not None else [])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "clusterkernel.client.cluster._guard", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not reach it
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def release(self) -> None:
        """Tell the guard we stopped the cluster ourselves, and wait for it to go."""
        self._say(b"stopped\n")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def detach(self) -> None:
        """Leave a kept cluster to the guard (it keeps it, see ``_guard.keep``)."""
        self._say(b"detached\n")

    def _say(self, line: bytes) -> None:
        try:
            self._proc.stdin.write(line)
            self._proc.stdin.close()
        except OSError:
            pass


def private_cluster_file(ipp_cluster: ipp.Cluster) -> None:
    """Write the cluster file now, readable by the user alone.

    ipyparallel writes it with the umask's mode; it names every process and the
    connection files (rewrites keep the mode).
    """
    ipp_cluster.update_cluster_file()
    os.chmod(ipp_cluster.cluster_file, 0o600)


def batch_jobs(cluster_file: str) -> list[tuple[str, str]]:
    """``(scheduler, job id)`` of the batch jobs an ipyparallel cluster file names."""
    with open(cluster_file) as f:
        info = json.load(f)
    sets = info.get("engines", {}).get("sets", {}).values()
    # a set without a scheduler's name is an older cluster's Slurm job
    return [(s.get("scheduler") or "slurm", str(s["job_id"])) for s in sets if s.get("job_id")]


# ---------------------------------------------------------------- engine wait
def wait_for_engines(
    client: ipp.Client,
    n: int,
    *,
    old_pids: set[int],
    timeout: float,
    query: Callable[[list[int]], dict[int, dict] | None],
    ended: Callable[[], bool],
    output: Callable[[], str],
    waiting: Callable[[], str | None] = lambda: None,
    progress: Callable[[str | None], Any] | None = None,
    say_after: float | None = None,
) -> dict[int, dict]:
    """Wait until ``n`` engines answer that were not there before; their identities.

    Restarted engines take the old engine ids, so counting ids is not enough: an
    answer from a new pid is. ``waiting()`` may say why nothing can come yet (a
    job waiting in a queue): that time does not count against ``timeout``, and
    ``progress`` shows it as a live line. ``progress`` also hears how many ranks have
    registered, once the wait is ``say_after`` seconds old (default 20), and None at
    the end if it heard anything.
    """
    if say_after is None:
        say_after = _SAY_PROGRESS_AFTER
    started = time.monotonic()
    deadline = started + timeout
    queued_since: float | None = None
    shown = False
    try:
        while True:
            if ended():
                raise ClusterError(f"The MPI engines failed to start. Their output:\n{output()}")
            why = waiting()
            if why is not None:
                queued_since = queued_since or time.monotonic()
                waited = time.monotonic() - queued_since
                deadline = time.monotonic() + timeout  # the queue's time is not ours
                if progress is not None:
                    progress(f"{why}, {waited:.0f} s")
                    shown = True
                time.sleep(0.5)
                continue
            if time.monotonic() > deadline:
                said = output().strip() or "(nothing yet)"
                raise ClusterError(
                    f"Only {len(client.ids)} of {n} engines registered within {timeout:.0f}s. "
                    f"What the launcher said:\n{said}"
                )
            ids = list(client.ids)
            if progress is not None and time.monotonic() - started >= say_after:
                progress(f"Starting {n} MPI ranks: {min(len(ids), n)} of {n} registered")
                shown = True
            if len(ids) >= n:
                infos = query(ids)
                if infos and all(i["pid"] not in old_pids for i in infos.values()):
                    return infos
            time.sleep(0.05)
    finally:
        if shown and progress is not None:
            progress(None)
