"""The batch-system base: what every scheduler (Slurm, Grid Engine, ...) is (client side).

A scheduler is one subclass of :class:`BatchSystem`, in one module of this package. It
says, mostly as class attributes:

- its options (:class:`SchedulerOption`): ``Cluster(..., launcher=NAME, **options)``,
  ``%mpi start --scheduler NAME`` and ``%mpi export`` take them from here, help included;
- the job script: its own directives (``#SBATCH``, ``#$``) from one writer,
  :meth:`BatchSystem.directives`, and the line that starts the ranks inside the job,
  :attr:`BatchSystem.launch`: a scheduler's own job step (``srun``) or ``mpiexec`` on
  the job's hosts (:meth:`BatchSystem.mpiexec_line`: Open MPI reads Slurm's itself,
  Grid Engine's ``$PE_HOSTFILE`` is handed to it);
- submit, cancel, a job's state (one set of live states), and the words its launcher
  writes into the job's output about ranks that died (``_jobreport`` reads them).

Nothing outside a scheduler's class runs its commands (``tests/test_seam.py`` checks).

Example::

    from clusterkernel.client.scheduler import get
    sge = get("sge")(n=4, values={"queue": "all.q"})
    print(sge.export_script("python job.py", job_name="job", output="/tmp/job.out"))
    # #!/bin/bash / #$ -N job / #$ -pe mpi 4 / ... / mpiexec -n $NSLOTS python job.py
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from clusterkernel.client.errors import ClusterError

DEFAULT_TIME = "01:00:00"  # a job's time limit when none is given, on every path


class SchedulerError(ClusterError):
    """The scheduler refused the job or cannot be reached."""


class CommandHost(Protocol):
    """Where a scheduler's commands run when not here: a login node reached by SSH
    (``launch._ssh.Login``)."""

    def run(
        self, *command: str, input: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess: ...


@dataclass(frozen=True)
class SchedulerOption:
    """One option of a scheduler: ``Cluster(name=...)``, ``--name`` in ``%mpi start``.

    ``many``: a list of strings (extra options passed through as they are). ``magic``:
    offered by ``%mpi start`` too. ``export``: offered by ``%mpi export`` and
    ``clusterkernel export`` (with ``export_default`` there, where it differs).

    Example::

        SchedulerOption("queue", "the queue to submit to")
    """

    name: str
    help: str
    type: type = str
    default: Any = None
    many: bool = False
    magic: bool = True
    export: bool = False
    export_default: Any = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


class BatchSystem:
    """A batch scheduler's job for ``n`` ranks with ``values`` of its :attr:`options`.

    Subclasses fill in the class attributes and :meth:`directives`; the rest has a
    default that fits a scheduler whose commands print a job id and whose jobs run
    ``mpiexec`` (see ipyparallel's ``BatchSystemLauncher`` for the same idea).

    Example::

        class PBS(BatchSystem):
            name, title, prefix = "pbs", "PBS", "#PBS"
            submit_command, cancel_command = ("qsub",), ("qdel",)
            ...
    """

    name: ClassVar[str] = ""  # launcher="name", --scheduler name
    title: ClassVar[str] = ""  # in messages: "Slurm job 12: pending"
    prefix: ClassVar[str] = ""  # of a directive line: "#SBATCH", "#$"
    submit_command: ClassVar[tuple[str, ...]] = ()  # + the script; prints the job id
    job_id_pattern: ClassVar[str] = r"\d+"  # the job id in the submit command's output
    cancel_command: ClassVar[tuple[str, ...]] = ()  # + job ids
    live_states: ClassVar[frozenset[str]] = frozenset()  # queued or running: ranks to come
    queued_states: ClassVar[frozenset[str]] = frozenset()  # of live_states: waiting in queue
    ending_states: ClassVar[frozenset[str]] = frozenset()  # cancelled, processes still there
    options: ClassVar[tuple[SchedulerOption, ...]] = ()
    # How the ranks start inside the job: "mpiexec" (on the job's hosts, mpiexec_line)
    # or "step" (the scheduler's own step launcher, :meth:`step_line`)
    launch: ClassVar[str] = "mpiexec"
    export_flag: ClassVar[str] = ""  # %mpi export's option for this scheduler's file
    report_prefixes: ClassVar[tuple[str, ...]] = ()  # its own lines in a job's output
    in_job_env: ClassVar[str] = ""  # set inside a job of this scheduler (its job id)
    # every program of the scheduler's that the class runs: none is named anywhere else
    # (tests/test_seam.py), so the class is the one place a scheduler's commands live
    commands: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, n: int, values: dict[str, Any] | None = None, on: CommandHost | None = None
    ) -> None:
        known = {o.name for o in self.options}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise ValueError(
                f"{', '.join(u + '=' for u in unknown)} not an option of launcher="
                f"'{self.name}' (its options: {', '.join(sorted(known)) or 'none'})."
            )
        self.n = n
        # where this job's commands run: None here, else the login node (from outside)
        self.on = on
        self.values = {o.name: o.default for o in self.options} | dict(values or {})
        for option in self.options:
            if option.many:
                self.values[option.name] = _strings(option, self.values[option.name])
        self.check()

    # ------------------------------------------------------------ the job script
    def check(self) -> None:
        """Refuse a bad option value (``ValueError`` naming it) before anything starts."""

    def directives(self, job_name: str, output: str) -> list[str]:
        """The job's directives, without :attr:`prefix`: ``job_name``, ``output`` (the
        job's stdout and stderr together), ``n`` ranks and the options."""
        raise NotImplementedError

    def lines(self, job_name: str, output: str) -> list[str]:
        return [f"{self.prefix} {d}" for d in self.directives(job_name, output)]

    def step_line(self, command: str) -> str:
        """The scheduler's own launcher of ``command`` on every rank (``launch="step"``)."""
        raise NotImplementedError(f"{self.title} starts ranks with mpiexec")

    def mpiexec_line(self, command: str, mpiexec: str = "mpiexec") -> str:
        """``mpiexec`` of ``command`` on the job's ranks, where Open MPI reads the job's
        hosts itself (Slurm's); a scheduler whose hosts it cannot read hands them over
        in its own override (Grid Engine's)."""
        return f"{shlex.quote(mpiexec)} -n {self.n} {command}"

    def launch_line(self, command: str, how: str | None = None, mpiexec: str = "mpiexec") -> str:
        """The line of the job script that starts ``command`` on every rank: ``how``
        (default :attr:`launch`) is ``"step"`` or ``"mpiexec"``."""
        how = how or self.launch
        if how == "step":
            return self.step_line(command)
        if how == "mpiexec":
            return self.mpiexec_line(command, mpiexec)
        raise ValueError(f"launch must be 'step' or 'mpiexec', got {how!r}")

    def script(
        self, command: str, *, job_name: str, output: str, preamble: Iterable[str] = (),
        how: str | None = None, mpiexec: str = "mpiexec", shell: str = "/bin/bash",
    ) -> str:  # fmt: skip
        """A whole job script: the directives, ``preamble`` lines, the launch line."""
        lines = [f"#!{shell}", *self.lines(job_name, output), *preamble]
        lines.append(self.launch_line(command, how, mpiexec))
        return "\n".join(lines) + "\n"

    def export_script(self, command: str, *, job_name: str, output: str, **kw: Any) -> str:
        """The script ``%mpi export`` writes (a job a user submits by hand)."""
        return self.script(command, job_name=job_name, output=output, **kw)

    def export_output(self, script: str) -> str:
        """Where an exported job's output goes: ``<stem>-<job id>.out`` beside it."""
        raise NotImplementedError

    # ------------------------------------------------------------ the job
    # Each command runs here, or ``on`` a login node (from outside the cluster): the
    # job's own methods pass :attr:`on`; the guard and the kept clusters' listing run on
    # the login node itself, so they pass none.
    @classmethod
    def run(
        cls, *args: str, timeout: float = 30, check: bool = True, on: CommandHost | None = None
    ) -> str:
        """One of this scheduler's commands (``args[0]`` found on PATH); its stdout."""
        if on is not None:
            done = on.run(*args, timeout=timeout, check=False)
            if check and done.returncode != 0:
                raise SchedulerError(
                    f"`{' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}"
                )
            return done.stdout
        exe = shutil.which(args[0])
        if exe is None:
            raise SchedulerError(
                f"`{args[0]}` is not on PATH: {cls.title}'s client commands are needed for "
                f"launcher='{cls.name}' (load your site's {cls.title} module, or run on a "
                "login node)."
            )
        try:
            done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SchedulerError(
                f"`{' '.join(args)}` did not answer within {timeout:.0f}s."
            ) from None
        if check and done.returncode != 0:
            raise SchedulerError(
                f"`{' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    @classmethod
    def submit(
        cls, script: str, env: dict[str, str] | None = None, cwd: str | None = None,
        on: CommandHost | None = None,
    ) -> str:  # fmt: skip
        """Submit the job script at path ``script``; its job id."""
        if on is not None:  # the script on stdin, the job's variables by env
            with open(script) as f:
                text = f.read()
            pairs = [f"{k}={v}" for k, v in (env or {}).items()]
            done = on.run("env", *pairs, *cls.submit_command, input=text, check=False)
        else:
            done = cls._submit_here(script, env, cwd)
        said = (done.stdout + done.stderr).strip()
        m = re.search(cls.job_id_pattern, done.stdout)
        if done.returncode != 0 or m is None:
            raise SchedulerError(f"{cls.title} refused the job: {said or 'no answer'}")
        return m.group(0)

    @classmethod
    def _submit_here(
        cls, script: str, env: dict[str, str] | None, cwd: str | None
    ) -> subprocess.CompletedProcess:
        exe = shutil.which(cls.submit_command[0]) if cls.submit_command else None
        if exe is None:
            cls.run(
                cls.submit_command[0] if cls.submit_command else cls.name
            )  # says what is missing
        done = subprocess.run(
            [cast(str, exe), *cls.submit_command[1:], script],  # cls.run raised where None
            capture_output=True, text=True, timeout=60, env=env, cwd=cwd,
        )  # fmt: skip
        return done

    @classmethod
    def cancel(cls, job_ids: Iterable[str], on: CommandHost | None = None) -> None:
        """Cancel the jobs (their processes end soon after)."""
        jobs = [str(j) for j in job_ids if j]
        if on is not None:
            if jobs and cls.cancel_command:
                on.run(*cls.cancel_command, *jobs, check=False, timeout=30)
            return
        exe = shutil.which(cls.cancel_command[0]) if jobs and cls.cancel_command else None
        if exe is not None:
            subprocess.run(
                [exe, *cls.cancel_command[1:], *jobs],
                capture_output=True, timeout=30,
            )  # fmt: skip

    @classmethod
    def state(cls, job_id: str, on: CommandHost | None = None) -> tuple[str, str] | None:
        """``(state, reason)`` of a job; None once the scheduler no longer knows it."""
        raise NotImplementedError

    @classmethod
    def alive(cls, state: tuple[str, str] | None) -> bool:
        """Whether a job in ``state`` is queued or running (its ranks are to come or there)."""
        return state is not None and state[0] in cls.live_states

    @classmethod
    def why_ended(cls, job_id: str, on: CommandHost | None = None) -> str | None:
        """Why the job can no longer run ranks (None: it still can)."""
        state = cls.state(job_id, on=on)
        if cls.alive(state):
            return None
        said = state[0] if state else f"no longer known to {cls.title}"
        return f"{cls.title} job {job_id} ended ({said})"

    # ------------------------------------------------------------ where it runs
    @classmethod
    def normalize(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The options as the launch keeps them (one spelling for each request)."""
        return dict(values)

    @classmethod
    def steps_in_job(cls) -> bool:
        """Whether ranks started from inside a job of this scheduler are a step of that
        job (no job of their own): then ``launcher=None`` picks this scheduler."""
        return False

    @classmethod
    def resolve(cls, n: int | None, values: dict[str, Any], step: bool) -> tuple[int, dict]:
        """The number of ranks and the options, where the job's place may say them."""
        if n is None:
            raise ValueError(f"Give the number of ranks (n= / -n) of the {cls.title} job.")
        return n, values

    def step_command(self) -> list[str]:
        """The program and options that start the ranks as a step of this process's job."""
        raise NotImplementedError(f"{self.title} has no job steps")

    @classmethod
    def in_job(cls) -> bool:
        """Whether this process runs inside a job of this scheduler."""
        return bool(cls.in_job_env and os.environ.get(cls.in_job_env))

    def node_addresses(self, in_allocation: bool = False) -> list[str]:
        """Addresses of the hosts the job may run on (to pick the controller's address);
        ``in_allocation``: those of the job this process runs in."""
        return []


def _strings(option: SchedulerOption, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    out = tuple(str(a) for a in value)
    for arg in out:
        if not arg.strip() or re.search(r"[\r\n]", arg):
            raise ValueError(
                f"option {arg!r} ({option.name}=): give each option as a string on one "
                "line, e.g. '--constraint=a100'"
            )
    return out
