"""Engines as a batch job of any scheduler: the launcher beside ``mpiexec`` (client side).

:class:`BatchLauncher` is the :class:`~clusterkernel.client.launch.Launcher` of
every :class:`~clusterkernel.client.scheduler.BatchSystem` (``launcher="slurm"``,
``"sge"``, ...): it asks the scheduler for the job script, and its ipyparallel engine set
(:class:`ScheduledEngineSetLauncher`) submits and cancels through the scheduler's class,
so the scheduler's commands are written there alone. Inside the job the ranks start as
the scheduler says (:attr:`BatchLauncher.how`): its own job step (``srun``) or
``mpiexec`` on the job's hosts. A scheduler that runs the
notebook inside one of its jobs (Slurm's allocation) starts the ranks as a step there
instead, with no job of their own.

The controller listens on the one address through which this machine reaches the
scheduler's hosts, never on every interface unless asked.

Example::

    launcher = LaunchSettings(n=4, launcher="sge").build()   # a BatchLauncher
    launcher.system.title, launcher.how                      # ('Grid Engine', 'mpiexec')
    print(launcher.batch_script())                           # '#$ -pe mpi 4' among its lines
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from typing import TYPE_CHECKING

from ipyparallel.cluster.launcher import BatchEngineSetLauncher
from traitlets import Unicode
from traitlets.config import Config

from clusterkernel.client import scheduler
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.launch._engine_set import (
    base_config,
    engine_cmd,
    process_ended,
    process_signal,
    tail,
)
from clusterkernel.client.launch._login_controller import LoginControllerLauncher
from clusterkernel.client.launch._registry import register
from clusterkernel.client.launch._ssh import Login, LoginError, login, login_for
from clusterkernel.client.mpiexec import QUIET_OSC, MPIRuntime
from clusterkernel.client.scheduler import SchedulerError
from clusterkernel.protocol._net import route_source

# Open MPI starts its daemons on the job's other nodes through the scheduler (srun) with
# their output sent to /dev/null; a fault-tolerant job's daemons log how each of their
# ranks ended (its process watch, read by the notebook to say how a rank died), so that
# output must reach the job's log from every node, not only from mpiexec's own
_DAEMONS_ATTACHED = "--leave-session-attached"

if TYPE_CHECKING:
    from clusterkernel.client.launch._settings import LaunchSettings

_POLL = 1.0  # seconds between state queries (the notebook polls faster than that)


class ScheduledEngineSetLauncher(BatchEngineSetLauncher):
    """ipyparallel's engine set as one job of a clusterkernel scheduler: submit and cancel
    go through the scheduler's class, named by ``scheduler`` (kept in the cluster file,
    so the guard and an attached session cancel it the same way)."""

    # the cluster file names the class by this (ipyparallel imports it back on attach)
    entrypoint_name = "clusterkernel.client.launch._batch_job.ScheduledEngineSetLauncher"
    scheduler = Unicode("", config=True, help="the scheduler's name").tag(to_dict=True)
    # from outside the cluster: the login node its commands run on, the interpreter and
    # the cluster's directory there (empty: here)
    ssh = Unicode("", config=True).tag(to_dict=True)
    remote_python = Unicode("", config=True).tag(to_dict=True)
    remote_profile_dir = Unicode("", config=True).tag(to_dict=True)

    def _on(self) -> Login | None:
        """Where the scheduler's commands run: the login node from outside, else here."""
        return login(self.ssh, self.remote_python) if self.ssh else None

    @property
    def cluster_env(self) -> dict[str, str]:
        env = dict(super().cluster_env)
        if self.remote_profile_dir:
            env["IPP_PROFILE_DIR"] = self.remote_profile_dir
        return env

    def start(self, n: int = 1) -> str:
        self.write_batch_script(n)
        system, on = scheduler.get(self.scheduler), self._on()
        if on is not None:  # the login node's own environment, with the job's variables
            job_id = system.submit(self.batch_file, env=self.get_env(), on=on)
        else:
            env = {**os.environ, **self.get_env()}
            job_id = system.submit(self.batch_file, env=env, cwd=self.work_dir)
        self.job_id = job_id
        self.notify_start(job_id)
        return job_id

    def stop(self) -> str:
        if self.job_id:
            scheduler.get(self.scheduler).cancel([self.job_id], on=self._on())
        self.notify_stop({"job_id": self.job_id, "output": ""})
        return ""


def controller_address(nodes: list[str], title: str = "scheduler's") -> str:
    """The one local address through which every node is reached."""
    sources: Counter[str] = Counter()
    for node in nodes:
        try:
            sources[route_source(node)] += 1
        except OSError:
            continue
    if not sources:
        raise SchedulerError(
            f"No route from this machine to the {title} nodes ({', '.join(nodes) or 'none'}). "
            "Pass controller_ip= (the address the nodes can reach this machine on)."
        )
    if len(sources) > 1:
        raise SchedulerError(
            f"The {title} nodes are reached through different addresses of this machine "
            f"({', '.join(sources)}); pass controller_ip= with the one they all reach, "
            'or controller_ip="*" to listen on every interface.'
        )
    return next(iter(sources))


class BatchLauncher:
    """Engines as a job of the scheduler ``settings`` name (or a step of this process's
    job), as ``settings`` say.

    ``fault_tolerant=True`` starts the ranks with Open MPI's ``mpiexec`` inside the job,
    whatever the scheduler's own step, so that a dead rank can be respawned there.
    Refuses, before anything starts, what a scheduler cannot do with them: hosts (the
    scheduler chooses), bad option values (the scheduler's
    :meth:`~clusterkernel.client.scheduler.BatchSystem.check`).

    Example::

        launcher = BatchLauncher(LaunchSettings(n=4, launcher="slurm", time="2:00:00"))
        launcher.batch_script()      # the job script; "#SBATCH --time=2:00:00" among its lines
    """

    multi_node = True

    def __init__(self, settings: LaunchSettings) -> None:
        system = scheduler.get(settings.kind())
        if settings.hosts or settings.hostfile:
            raise ValueError(f"{system.title} chooses the hosts: leave out hosts=/hostfile=.")
        self.kind = system.name
        # from outside the cluster: every command of the scheduler's on the login node
        self.login: Login | None = None
        if settings.ssh:
            self.login = login_for(settings.ssh, settings.remote_python)
        # ranks as a step of the job this process is in (never from outside)
        self.step = system.steps_in_job() and self.login is None
        n, values = system.resolve(settings.n, system.normalize(settings.options()), self.step)
        self.settings = settings.with_ranks(n)
        self.system = system(n, values, on=self.login)  # checks the options
        # How the ranks start inside the job: the scheduler's step, or mpiexec. Fault
        # tolerance is Open MPI's (ULFM): a scheduler's step ends when one task dies, and
        # only mpiexec's daemons can start a dead rank's successor inside the job.
        self.fault_tolerant = settings.fault_tolerant
        self.how = "mpiexec" if self.fault_tolerant else system.launch
        # from outside, the login node's mpiexec and its environment, asked there at
        # the start (_runtime_on_login): none of this machine's applies to the job
        self.runtime: MPIRuntime | None = None
        self._runtime_env: dict[str, str] | None = None
        if self.how == "mpiexec" and self.login is None:
            self.runtime = MPIRuntime.detect(settings.mpiexec)
            self._check_runtime()
        self._controller_ip = settings.controller_ip
        self.job_id: str | None = None
        self._state: tuple[str, str] | None = None
        self._state_at = 0.0
        self._failing_since: float | None = None  # queries of the state failing (ssh)

    def _check_runtime(self) -> None:
        runtime = self.runtime  # not None when fault-tolerant: the ranks start with mpiexec
        if self.fault_tolerant and runtime is not None and runtime.flavor == "mpich":
            raise ValueError(
                f"fault_tolerant=True needs Open MPI's mpiexec (ULFM); {runtime.mpiexec} "
                f"is {runtime.flavor}. Give mpiexec= an Open MPI 5 one, or leave "
                "fault_tolerant out."
            )

    def _runtime_on_login(self) -> None:
        """From outside, where the ranks start with ``mpiexec``: the login node's, with
        the environment made there (``Login.mpi_runtime``), once."""
        if self.login is None or self.how != "mpiexec" or self.runtime is not None:
            return
        exe, flavor, env = self.login.mpi_runtime(self.settings.mpiexec, self.fault_tolerant)
        self.runtime, self._runtime_env = MPIRuntime(exe, flavor), env
        self._check_runtime()

    @property
    def n(self) -> int:
        n = self.settings.n
        assert n is not None  # __init__ put the count it starts there (with_ranks)
        return n

    def engines(self) -> str | type:
        return "mpi" if self.step else ScheduledEngineSetLauncher

    def describe(self) -> str:
        return f"{self.kind} step" if self.step else self.kind

    def controller_ip(self) -> str:
        if self._controller_ip is None:
            if self.login is not None:  # refused in seconds, before the scheduler is asked
                self.login.check(self.system.submit_command[0])
            addrs = self.system.node_addresses(in_allocation=self.step)
            if self.login is not None:  # the login node's route to them
                self._controller_ip = self.login.controller_address(addrs, self.system.title)
            else:
                self._controller_ip = controller_address(addrs, self.system.title)
        return self._controller_ip

    def controller(self) -> str | None:
        """ipyparallel's controller launcher: on the login node from outside, else here."""
        return LoginControllerLauncher.entrypoint_name if self.login is not None else None

    def remote_dir(self, run_dir: str) -> str:
        """Where the cluster's files live on the ranks' side (``run_dir``, or its place
        under the login node's home from outside)."""
        return self.login.home_path(run_dir) if self.login is not None else run_dir

    # ------------------------------------------------------------ configuration
    def batch_script(self) -> str:
        """The job script (an ipyparallel template: ``{program_and_args}`` and friends)."""

        def esc(text: str) -> str:  # literal text in a str.format template
            return text.replace("{", "{{").replace("}", "}}")

        name, out = "\0name", "\0output"  # placeholders for the template's own fields
        lines = [
            esc(line).replace(name, "clusterkernel-{cluster_id}").replace(out, "{output_file}")
            for line in self.system.lines(name, out)
        ]
        mpiexec = self.runtime.mpiexec if self.runtime is not None else "mpiexec"
        program = "\0program"  # the launch line may hold braces of its own (awk's)
        launch = esc(self.system.launch_line(program, self.how, mpiexec))
        attached = f"{_DAEMONS_ATTACHED} " if self.fault_tolerant else ""
        launch = launch.replace(program, attached + "{program_and_args}")
        return "\n".join(["#!/bin/sh", *lines, launch]) + "\n"

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        base = {"PATH": os.environ.get("PATH", "")}
        if self._runtime_env is not None:  # made on the login node
            base = dict(self._runtime_env)
        elif self.runtime is not None:  # mpiexec's own settings (root, oversubscribing, ULFM)
            base = self.runtime.env(base, fault_tolerant=self.fault_tolerant, scheduler_hosts=True)
        quiet = {k: os.environ.get(k, v) for k, v in QUIET_OSC.items()}
        return {**base, **quiet, **env}

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        self._runtime_on_login()
        cfg = base_config()
        full = self._environment(env)
        if self.step:
            launcher = cfg.MPIEngineSetLauncher
            if self.runtime is not None:  # mpiexec in this allocation (ipyparallel adds -n)
                command = [
                    self.runtime.mpiexec,
                    *self.runtime.args(fault_tolerant=self.fault_tolerant),
                    *([_DAEMONS_ATTACHED] if self.fault_tolerant else []),
                ]
            else:
                command = self.system.step_command()
            launcher.mpi_cmd, launcher.mpi_args = command[:1], command[1:]
            launcher.engine_args = ["--log-level=WARN"]  # MPIEngineSetLauncher adds --mpi
        else:
            launcher = cfg.ScheduledEngineSetLauncher
            launcher.scheduler = self.kind
            launcher.batch_template = self.batch_script()
            # absolute: ipyparallel joins it to its work_dir, the current directory
            launcher.batch_file_name = os.path.join(run_dir, f"engines.{self.kind}")
            launcher.output_file = os.path.join(run_dir, "engines.out")
            launcher.engine_args = ["--log-level=WARN", "--mpi"]
        launcher.environment = full
        launcher.engine_cmd = engine_cmd(full)
        if self.login is not None:
            self._outside(cfg, launcher, run_dir)
        return cfg

    def _outside(self, cfg: Config, launcher, run_dir: str) -> None:
        """From outside: the controller and the job's files on the login node."""
        login = self.login
        assert login is not None
        remote = login.home_path(run_dir)
        login.profile_dir(remote)
        launcher.ssh, launcher.remote_python = login.host, login.python
        launcher.remote_profile_dir = remote
        launcher.output_file = f"{remote}/engines.out"
        # the login node's own PATH; the run-directory mark is its directory there
        env = {k: v for k, v in launcher.environment.items() if k != "PATH"}
        env = {k: (remote if v == run_dir else v) for k, v in env.items()}
        launcher.environment = env
        launcher.engine_cmd = [login.python, *engine_cmd(env)[1:]]
        ctl = cfg.SSHControllerLauncher
        ssh = login.ssh()
        ctl.ssh_cmd, ctl.hostname = ssh[:-1], login.host
        # scp runs the ssh of PATH (the user's, as every other command here), not its own
        ctl.scp_cmd = ["scp", "-S", shutil.which("ssh") or "ssh", *ssh[1:-1]]
        ctl.remote_python = login.python
        # its client sockets hand a reconnected client's routing id over (see the module)
        ctl.controller_cmd = [login.python, "-m", "clusterkernel.client.launch._handover"]
        ctl.remote_profile_dir = remote
        ctl.controller_args = list(cfg.LocalControllerLauncher.controller_args)

    # ------------------------------------------------------------ the job
    def _job_state(self, engine_set) -> tuple[str, str] | None:
        """``(state, reason)`` of the engines' job (``("GONE", "")`` once the scheduler
        forgot it), at most one query a second."""
        job = getattr(engine_set, "job_id", None)
        if not job:
            return None
        now = time.monotonic()
        if self._state is None or job != self.job_id or now - self._state_at > _POLL:
            if self._reconnecting(job):
                return self._state  # unknown while the guard makes the connection again
            try:
                state = self.system.state(job, on=self.system.on) or ("GONE", "")
            except LoginError:
                if not (self._reconnecting(job) or self._may_be_lost(job, now)):
                    raise
                return self._state
            self.job_id = job
            self._state, self._state_at = state, now
            self._failing_since = None
        return self._state

    def _may_be_lost(self, job: str, now: float) -> bool:
        """Whether a query of the job's state that ssh failed may be the connection just
        lost, before the guard has noticed (it then makes it again): so for the guard's
        own grace after the first such failure, and no longer."""
        from clusterkernel.client.launch._guard import grace_s  # it imports the cluster

        if self.login is None or self._state is None or job != self.job_id:
            return False
        if self._failing_since is None:
            self._failing_since = now
        return now - self._failing_since < grace_s()

    def _reconnecting(self, job: str) -> bool:
        """Whether the connection to the login node is lost and being made again (the
        job's state is the last one read, not an end)."""
        return (
            self.login is not None and self.login.lost
            and self._state is not None and job == self.job_id
        )  # fmt: skip

    def waiting(self, engine_set) -> str | None:
        state = None if self.step else self._job_state(engine_set)
        if state is None or state[0] not in self.system.queued_states:
            return None
        reason = f" ({state[1]})" if state[1] else ""
        return f"{self.system.title} job {self.job_id}: {state[0].lower()}{reason}"

    def ended(self, engine_set) -> bool:
        if self.step:
            return process_ended(engine_set)
        state = self._job_state(engine_set)
        return state is not None and state[0] not in self.system.live_states

    def killed_by(self, engine_set) -> int | None:
        if self.step:
            return process_signal(engine_set)
        if self.how != "mpiexec" or not self.ended(engine_set):  # srun is exec'd: no shell
            return None
        # mpiexec in the job: its script's shell writes how it ended in the job's output
        from clusterkernel.client.cluster._jobreport import launcher_signal

        return launcher_signal(self.output(engine_set, 400))

    def output(self, engine_set, lines: int = 40) -> str:
        if self.login is not None:
            path = getattr(engine_set, "output_file", "")
            if not path:
                return ""
            try:
                done = self.login.run("tail", "-n", str(lines), path, check=False, timeout=15)
            except ClusterError:
                return ""
            return done.stdout.rstrip()
        if self.step:
            return tail(engine_set.get_output() if engine_set is not None else "", lines)
        # read the file each time: the launcher caches its first read
        try:
            with open(getattr(engine_set, "output_file", "") or os.devnull) as f:
                return tail(f.read(), lines)
        except OSError:
            return ""

    def stopped(self, engine_set, timeout: float) -> None:
        """After the job's cancel: wait until the scheduler has its processes gone."""
        if self.step or not getattr(engine_set, "job_id", None):
            return
        gone_from = self.system.live_states | self.system.ending_states
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._state = None
            state = self._job_state(engine_set)
            if state is None or state[0] not in gone_from:
                return
            time.sleep(0.2)


for _name in scheduler.schedulers():  # every scheduler's job: this launcher
    register(_name, BatchLauncher)
