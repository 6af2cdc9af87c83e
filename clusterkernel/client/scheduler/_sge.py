"""Grid Engine (Son of Grid Engine, Univa/Altair GE) as a
:class:`~clusterkernel.client.scheduler.BatchSystem` (client side).

The engines are one job, ``qsub`` of a script that asks for ``n`` slots of a parallel
environment (``-pe mpi n``) and runs ``mpiexec`` inside it on the job's hosts
(``$PE_HOSTFILE``), its daemons on other hosts started with ``qrsh -inherit`` (the
parallel environment needs ``control_slaves TRUE``; :meth:`GridEngine.mpiexec_line`).
``qstat`` says the job's state, ``qdel`` cancels it; ``-j y -o FILE`` puts its output
in one file.

Example::

    GridEngine(n=4, values={"queue": "all.q"}).directives("job", "/tmp/job.out")
    # ['-N job', '-pe mpi 4', '-o /tmp/job.out', '-j y', '-V', '-S /bin/sh', '-notify',
    #  '-l h_rt=01:00:00', '-q all.q']
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from clusterkernel.client.scheduler._system import (
    DEFAULT_TIME,
    BatchSystem,
    CommandHost,
    SchedulerError,
    SchedulerOption,
)

# h_rt: seconds, HH:MM:SS, or no limit
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|(?i:infinity|unlimited)")
_NAME = re.compile(r"[\w.+@-]+(,[\w.+@-]+)*")


class GridEngine(BatchSystem):
    """A Grid Engine job of ``n`` slots of a parallel environment, ranks by ``mpiexec``.

    Example::

        GridEngine(n=4).launch_line("python job.py")   # ... 'mpiexec --hostfile ... -n 4 python job.py'
    """

    name = "sge"
    title = "Grid Engine"
    prefix = "#$"
    submit_command = ("qsub", "-terse")  # prints the job id alone
    job_id_pattern = r"\d+"
    cancel_command = ("qdel",)
    # qstat's state letters: queued (qw, held hqw), transferring (t), running (r),
    # suspended (s, S, T), restarted (R...); "d" is deletion under way, "E" an error
    # that keeps the job from ever running (it is over for us)
    queued_states = frozenset({"qw", "hqw", "hRwq", "Rq"})
    live_states = queued_states | frozenset(
        {"r", "t", "Rr", "Rt", "s", "ts", "S", "tS", "T", "tT", "Rs", "RS", "RT"}
    )
    ending_states = frozenset({"dr", "dt", "dRr", "dRt", "ds", "dS", "dT", "dqw", "dhqw"})
    launch = "mpiexec"
    export_flag = "--qsub"
    report_prefixes = ()
    in_job_env = "PE_HOSTFILE"
    commands = ("qsub", "qdel", "qstat", "qconf", "qacct", "qrsh", "qmod")
    options = (
        SchedulerOption("queue", "the queue to submit to (default: Grid Engine's pick)",
                        export=True),
        SchedulerOption("pe", "the parallel environment for the ranks' slots (default mpi)",
                        default="mpi", export=True, export_default="mpi"),
        SchedulerOption("time", f"time limit (default {DEFAULT_TIME})",
                        default=DEFAULT_TIME, export=True, export_default=DEFAULT_TIME),
        SchedulerOption("sge_args", "further qsub options, one each ('-l mem_free=4G')",
                        many=True, magic=False),
    )  # fmt: skip

    def check(self) -> None:
        v = self.values
        time = v["time"]
        if time is not None and not (isinstance(time, str) and _TIME.fullmatch(time)):
            raise ValueError(
                f"--time {time!r}: use seconds or HH:MM:SS, e.g. {DEFAULT_TIME} (the default), "
                "or INFINITY"
            )
        for flag in ("queue", "pe"):
            value = v[flag]
            if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
                raise ValueError(f"--{flag} {value!r}: use letters, digits, '.', '_', '+', '-'")
        if not v["pe"]:
            raise ValueError("--pe: Grid Engine needs a parallel environment for MPI ranks")

    def directives(self, job_name: str, output: str) -> list[str]:
        v = self.values
        time = v["time"]
        if isinstance(time, str) and time.lower() == "unlimited":
            time = "INFINITY"
        # -notify: qdel sends SIGUSR2 before its SIGKILL, which mpiexec_line's trap turns
        # into mpiexec's own ending of the ranks (see there)
        lines = [f"-N {job_name}", f"-pe {v['pe']} {self.n}", f"-o {output}", "-j y", "-V",
                 "-S /bin/sh", "-notify"]  # fmt: skip
        lines += [f"-l h_rt={time}"] if time else []
        lines += [f"-q {v['queue']}"] if v["queue"] else []
        return lines + list(v["sge_args"])

    def mpiexec_line(self, command: str, mpiexec: str = "mpiexec") -> str:
        """``mpiexec`` on the job's slots: the hosts of ``$PE_HOSTFILE`` as an Open MPI
        hostfile (Open MPI builds without Grid Engine support, pip's among them, do not
        read it), daemons on other hosts started by ``qrsh -inherit`` (the parallel
        environment's ``control_slaves``), as Open MPI's own Grid Engine support does.

        ``qdel`` kills the job's process group, and Open MPI's ranks run in process
        groups of their own: a SIGKILLed ``mpiexec`` leaves them running, with their
        shared-memory files, on every host. So the job asks for a warning first
        (``-notify``: SIGUSR2, the queue's ``notify`` time before the SIGKILL), on which
        the script sends ``mpiexec`` SIGTERM: it ends the ranks and removes their files,
        and the job ends before the SIGKILL."""
        hosts = '"${TMPDIR:-/tmp}/clusterkernel-hosts.$JOB_ID"'
        return "\n".join([
            f"awk '{{print $1\" slots=\"$2}}' \"$PE_HOSTFILE\" > {hosts}",
            "export PRTE_MCA_plm_ssh_agent='qrsh -inherit -nostdin -V'",
            "trap 'kill -TERM $ranks 2>/dev/null' USR2",
            f"{shlex.quote(mpiexec)} --hostfile {hosts} -n {self.n} {command} &",
            "ranks=$!",
            # a trapped signal ends a wait early: wait again until mpiexec has ended
            # the hostfile goes with the job ($TMPDIR is the job's own only where the
            # queue gives it one)
            "while :; do wait $ranks; status=$?; kill -0 $ranks 2>/dev/null || break; done",
            f"rm -f {hosts}",
            "exit $status",
        ])  # fmt: skip

    def export_output(self, script: str) -> str:
        path = Path(script)
        return str(path.with_name(path.stem + "-$JOB_ID.out"))

    @classmethod
    def state(cls, job_id: str, on: CommandHost | None = None) -> tuple[str, str] | None:
        try:
            out = cls.run("qstat", "-u", "*", on=on)
        except SchedulerError:
            return None  # qmaster gone: the job is over for us
        for line in out.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[0] == str(job_id):
                return fields[4], ""
        return None  # finished jobs leave qstat

    def node_addresses(self, in_allocation: bool = False) -> list[str]:
        try:
            return self.run("qconf", "-sel", on=self.on).split()
        except SchedulerError:
            return []
