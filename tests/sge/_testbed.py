"""A real one-machine Grid Engine on the test machine (Son of Grid Engine 8.1.9, Debian's
``gridengine-master``, ``gridengine-exec`` and ``gridengine-client``), as root.

A qmaster and an execd on this host, which Grid Engine knows as ``localhost``; queue
``all.q`` with 8 slots and a parallel environment ``mpi`` (``$fill_up``,
``control_slaves TRUE``) that Open MPI's ``mpiexec`` recognises inside a job
(``$PE_HOSTFILE``, ``$NSLOTS``). What it took (the recipe is ../shared/sge/):

- Grid Engine refuses a client whose address resolves to another name than its own, so
  everything is called ``localhost`` and the machine's own name is an alias of it
  (``$SGE_ROOT/default/common/host_aliases``);
- the cluster configuration's ``min_uid``/``min_gid`` are lowered to 0 so root may
  submit;
- the scheduler runs every second and at each submit (its default, every 15 s, made a
  start take 15 s), and neither a load threshold on the queue nor the scheduler's load
  adjustment per started slot holds a job back (on a busy 2-core machine they did: "PE
  mpi only offers 2 slots" for 40 s and more);
- an execd that died leaves the queue in an error state: ``qmod -cq all.q`` clears it.

Daemons already running are used and left running; :meth:`SgeTestbed.stop` stops only
those it started, by their pid files, after ``qdel`` of every job still queued. A job's
processes are the descendants of the execd (:meth:`SgeTestbed.job_pids`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SGE_ROOT = "/var/lib/gridengine"
SGE_CELL = "default"
DAEMONS = {
    "qmaster": ("/usr/lib/gridengine/sge_qmaster", "/var/spool/gridengine/qmaster/qmaster.pid"),
    "execd": ("/usr/lib/gridengine/sge_execd", "/var/spool/gridengine/execd/localhost/execd.pid"),
}
NEEDED = ("qsub", "qstat", "qdel", "qconf", "qhost", "qmod")
PACKAGES = "gridengine-master gridengine-exec gridengine-client"

_PE = """\
pe_name mpi
slots 16
user_lists NONE
xuser_lists NONE
start_proc_args NONE
stop_proc_args NONE
allocation_rule $fill_up
control_slaves TRUE
job_is_first_task FALSE
urgency_slots min
accounting_summary FALSE
qsort_args NONE
"""
_EXEC = """\
hostname localhost
load_scaling NONE
complex_values NONE
user_lists NONE
xuser_lists NONE
projects NONE
xprojects NONE
usage_scaling NONE
report_variables NONE
"""


def missing() -> list[str]:
    """What this machine lacks for the test bed (empty: it can run)."""
    out = [p for p in NEEDED if shutil.which(p) is None]
    return out + [Path(d).name for d, _ in DAEMONS.values() if not os.access(d, os.X_OK)]


def daemon_pid(name: str) -> int | None:
    """The pid of a running Grid Engine daemon, from its pid file."""
    try:
        pid = int(Path(DAEMONS[name][1]).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if psutil.pid_exists(pid) else None


@dataclass
class SgeTestbed:
    """A one-machine Grid Engine; ``start()`` it, use :attr:`env`, always ``stop()``."""

    env: dict[str, str] = field(default_factory=dict)  # for clients and jobs
    started: list[str] = field(default_factory=list)  # the daemons this one started

    def _run(self, *cmd: str, check: bool = True, stdin: str | None = None) -> str:
        done = subprocess.run(
            cmd, capture_output=True, text=True, input=stdin, timeout=60,
            env={**os.environ, **self.env},
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def _wait(self, pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Grid Engine test bed: {what} within {timeout:.0f}s")
            time.sleep(0.2)

    # ------------------------------------------------------------ start
    def start(self) -> SgeTestbed:
        self.env = {
            "SGE_ROOT": SGE_ROOT,
            "SGE_CELL": SGE_CELL,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            # the ranks share 2 cores: one waiting in MPI must yield them, one torch
            # (OpenMP) thread each (as the Slurm bed, tests/slurm/_testbed.py)
            "OMPI_MCA_mpi_yield_when_idle": "1",
            "OMP_NUM_THREADS": "1",
            # all.q's 8 slots on 2 cores: PRRTE's bind-to-core would refuse 4 ranks
            "PRTE_MCA_hwloc_default_binding_policy": "none",
        }
        common = Path(SGE_ROOT, SGE_CELL, "common")
        (common / "host_aliases").write_text(f"localhost {os.uname().nodename}\n")
        (common / "act_qmaster").write_text("localhost\n")
        self._daemon("qmaster")
        self._wait(lambda: self._ok("qstat"), 30, "the qmaster did not answer")
        self._configure()
        self._daemon("execd")
        self._wait(self._exec_host_up, 30, "the execd did not report")
        self._run("qmod", "-cq", "all.q", check=False)  # an error state of an earlier run
        self._wait(self._queue_ready, 60, "queue all.q did not take jobs")
        return self

    def _daemon(self, name: str) -> None:
        if daemon_pid(name) is None:
            self._run(DAEMONS[name][0])  # it forks into the background and writes its pid
            self._wait(lambda: daemon_pid(name) is not None, 30, f"sge_{name} did not start")
            self.started.append(name)

    def _ok(self, *cmd: str) -> bool:
        try:
            self._run(*cmd)
            return True
        except RuntimeError:
            return False

    def _exec_host_up(self) -> bool:
        out = self._run("qhost", check=False)
        return any(ln.startswith("localhost ") and "lx-amd64" in ln for ln in out.splitlines())

    def _queue_ready(self) -> bool:
        """all.q has its host's load and no state (unknown, alarm, error) that holds jobs."""
        for line in self._run("qstat", "-f", "-q", "all.q", check=False).splitlines():
            fields = line.split()
            if fields[:1] == ["all.q@localhost"]:
                return len(fields) == 5 and fields[3] != "-NA-"
        return False

    def _configure(self) -> None:
        """The bed's configuration, made once (each step looks before it changes)."""
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            glob = self._run("qconf", "-sconf", "global")
            for key, value in (("min_uid", "0"), ("min_gid", "0"), ("load_report_time", "0:0:2")):
                glob = _set(glob, key, value)  # root submits; a new execd reports at once
            (tmp / "global").write_text(glob)  # -Mconf takes the name from the file's
            self._run("qconf", "-Mconf", str(tmp / "global"), check=False)
            sched = self._run("qconf", "-ssconf")
            for key, value in (
                ("schedule_interval", "0:0:1"), ("flush_submit_sec", "1"),
                ("flush_finish_sec", "1"), ("job_load_adjustments", "NONE"),
                ("load_adjustment_decay_time", "0:0:0"),
            ):  # fmt: skip
                sched = _set(sched, key, value)
            (tmp / "sched").write_text(sched)
            self._run("qconf", "-Msconf", str(tmp / "sched"), check=False)
            if "localhost" not in self._run("qconf", "-sh", check=False).split():
                self._run("qconf", "-ah", "localhost")
            if "localhost" not in self._run("qconf", "-ss", check=False).split():
                self._run("qconf", "-as", "localhost")
            if "localhost" not in self._run("qconf", "-sel", check=False).split():
                (tmp / "exec").write_text(_EXEC)
                self._run("qconf", "-Ae", str(tmp / "exec"))
            if "mpi" not in self._run("qconf", "-spl", check=False).split():
                (tmp / "pe").write_text(_PE)
                self._run("qconf", "-Ap", str(tmp / "pe"))
            exists = "all.q" in self._run("qconf", "-sql", check=False).split()
            queue = self._run("qconf", "-sq", *(["all.q"] if exists else []))  # or the template
            for key, value in (
                ("qname", "all.q"), ("hostlist", "localhost"), ("pe_list", "mpi"),
                ("slots", "8"), ("shell_start_mode", "unix_behavior"),
                ("load_thresholds", "NONE"),
            ):  # fmt: skip
                queue = _set(queue, key, value)
            (tmp / "queue").write_text(queue)
            self._run("qconf", "-Mq" if exists else "-Aq", str(tmp / "queue"))

    # ------------------------------------------------------------ looking
    def jobs(self) -> list[str]:
        """Ids of every job Grid Engine holds (queued, running, being deleted)."""
        out = self._run("qstat", "-u", "*", check=False)
        rows = (line.split() for line in out.splitlines())
        return [row[0] for row in rows if row and row[0].isdigit()]

    def job_pids(self) -> list[int]:
        """Processes the jobs run: the execd's descendants (its shepherds and theirs)."""
        pid = daemon_pid("execd")
        if pid is None:
            return []
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []
        return [p.pid for p in kids if _alive(p)]

    def leftovers(self, timeout: float = 20.0) -> tuple[list[str], list[int]]:
        """``(jobs, job processes)``, once both are empty or at ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = (self.jobs(), self.job_pids())
            if not any(left) or time.monotonic() > deadline:
                return left
            time.sleep(0.25)

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        jobs = self.jobs() if daemon_pid("qmaster") else []
        if jobs:
            self._run("qdel", "-f", *jobs, check=False)
        for name in ("execd", "qmaster"):
            pid = daemon_pid(name) if name in self.started else None
            if pid is None:
                continue
            proc = psutil.Process(pid)
            proc.terminate()
            try:
                proc.wait(30)
            except psutil.TimeoutExpired:
                proc.kill()
        self.started.clear()


def _set(conf: str, key: str, value: str) -> str:
    """``conf`` (Grid Engine's ``key value`` lines) with ``key`` set to ``value``."""
    lines = [f"{key} {value}" if ln.split()[:1] == [key] else ln for ln in conf.splitlines()]
    return "\n".join(lines) + "\n"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
