"""Read what the launcher said when an MPI job ended (client side).

Every parser of a launcher's log lives here: Open MPI's ``prterun``, MPICH's Hydra
and Slurm's ``srun`` each word a dead rank differently, and the runner only wants
to know *which* ranks died and *how*. Which lines of a job's output are a scheduler's
own (``srun:``) its class says (``BatchSystem.report_prefixes``); why a job ended as
a whole (cancelled, out of time) is the scheduler's ``why_ended``.

Example::

    report = job_report(launcher_log)
    dead_ranks(report, n=4)          # [2]
    death_cause(report)              # "killed by SIGKILL"
    exits(launcher_log)              # {13690: "killed by SIGKILL"}: by pid
    lost_daemon(report)              # LostDaemon(node="node2", how="killed by SIGSEGV")
    launcher_abort(report)           # "PMIX ERROR: ...", if prterun aborted itself
    open_mpi_failed(report)          # either of the two, told; else None
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

__all__ = [
    "job_report",
    "dead_ranks",
    "death_cause",
    "exits",
    "lost_daemon",
    "LostDaemon",
    "launcher_abort",
    "open_mpi_failed",
    "OUT_OF_MEMORY",
]

# Lines of ipyparallel's own processes, and of PRRTE's process watch (a fault-tolerant
# job's, see exits), noise in a launcher's report.
_IPP_NOISE = ("[KernelNanny", "[IPEngine", "[IPController", "odls:")


def job_report(output: str) -> str:
    """MPI's or the scheduler's own message from a launcher's log.

    Open MPI boxes its messages between ``----`` rules; a scheduler's launcher prefixes
    its lines (``srun:``, its class's ``report_prefixes``); otherwise the last lines that
    are not ipyparallel's own.
    """
    from clusterkernel.client import scheduler

    own = tuple(p for s in scheduler.schedulers().values() for p in s.report_prefixes)
    abort = _LAUNCHER_ABORT.search(output)
    blocks = [abort.group(0)] if abort else []
    blocks += re.findall(r"^-{20,}\n(.*?)^-{20,}$", output, flags=re.S | re.M)
    # srun writes the job's output file at an offset of its own: its line can start after
    # NUL bytes (a hole the other writers' bytes did not fill) or blanks
    lines = [ln.lstrip(" \t\0") for ln in output.splitlines()]
    srun = [ln for ln in lines if own and ln.startswith(own)]
    if blocks or srun:
        return "\n".join([*(b.strip() for b in blocks), *srun])
    lines = [ln for ln in output.splitlines() if not any(m in ln for m in _IPP_NOISE)]
    return "\n".join(lines[-20:]) or "The launcher exited without a message."


def _ranks_in(text: str) -> set[int]:
    """``"3"`` -> {3}; ``"0-1,4"`` -> {0, 1, 4} (srun's task lists)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            out.update(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return out


def dead_ranks(report: str, n: int) -> list[int]:
    """The ranks a launcher's report names as the ones that died first."""
    found: set[int] = set()
    for pat in (
        r"rank\s+(\d+)\s+with\s+PID",  # prterun: "process rank 2 with PID ..."
        r"Process name: \[[^,\]]+,(\d+)\]",  # prterun: non-zero exit status
        r"\[proxy:[^\]]*\] .*rank (\d+)",  # hydra
    ):
        found.update(int(m) for m in re.findall(pat, report))
    if open_mpi_failed(report) is not None:
        return sorted(r for r in found if r < n)  # srun's tasks were the daemons, not ranks
    # srun: "srun: error: node2: task 3: Exited with exit code 3"
    for m in re.findall(r"srun: error: [^:]+: tasks? ([\d,\-]+):", _srun_first(report)):
        found.update(_ranks_in(m))
    return sorted(r for r in found if r < n)


def _srun_first(report: str) -> str:
    """srun's report up to where it starts killing the other tasks.

    After the first failure srun terminates the step ("srun: Terminating StepId"),
    and then names every task it killed: those did not die first.
    """
    m = re.search(r"^srun: (Terminating|Job step aborted|forcing job termination)", report, re.M)
    return report[: m.start()] if m else report


OUT_OF_MEMORY = "out of memory: the kernel's OOM killer ended it (SIGKILL)"


def death_cause(report: str) -> str:
    """``"exit code 3"`` or ``"killed by SIGKILL"`` from a launcher's report
    (:data:`OUT_OF_MEMORY` where Slurm says it killed a task for its memory)."""
    if re.search(r"oom[_-]kill event|: Out Of Memory", _srun_first(report)):
        return OUT_OF_MEMORY
    m = re.search(r"exited\s+on\s+signal\s+(\d+)(?:\s+\(([^)]+)\))?", report)
    if m:
        return killed_by(int(m.group(1)))
    m = re.search(r"Exit code:\s*(-?\d+)", report) or re.search(r"exit code[: ]+(-?\d+)", report)
    if m:
        return f"exit code {m.group(1)}"
    m = re.search(
        r"srun: error: [^:]+: tasks? [\d,\-]+: (Killed|Segmentation fault|Aborted)",
        _srun_first(report),
    )
    if m:
        number = {"Killed": 9, "Segmentation fault": 11, "Aborted": 6}[m.group(1)]
        return killed_by(number)
    return ""


@dataclass(frozen=True)
class LostDaemon:
    """Open MPI's launcher lost the daemon (``prted``) of ``node``: every rank there went
    with it, and the launcher ended the job. ``how``: how the daemon ended, if its
    launcher (srun) said, e.g. ``"killed by SIGSEGV"``."""

    node: str
    how: str = ""

    def __str__(self) -> str:
        return f"Open MPI's daemon on {self.node} died" + (f" ({self.how})" if self.how else "")

    def ranks(self, hosts: dict[int, str]) -> list[int]:
        """The ranks of ``hosts`` (rank -> host name) on the daemon's node: short names
        compared, as Slurm names a node ``node2`` whose host name may be ``node2.cluster``."""
        node = self.node.split(".")[0]
        return sorted(r for r, host in hosts.items() if host.split(".")[0] == node)


_LOST_DAEMON = re.compile(
    r"lost communication with a remote daemon.*?Remote daemon:\s*\[[^\]]*\]\s+on node\s+(\S+)",
    re.S,
)


# prterun's own end when it fails inside itself: its error, then an assertion or abort
_LAUNCHER_ABORT = re.compile(
    r"^.*PMIX ERROR: .*$\n(?:.*\n)*?(?:.*Assertion .* failed.*|Aborted)$", re.M
)


def launcher_abort(report: str) -> str | None:
    """The error Open MPI's launcher (prterun) printed before it aborted itself
    (``"PMIX ERROR: ..."``, then a failed assertion or ``Aborted``), or None. Its ranks
    lose their runtime with it: a fault inside Open MPI, not in a rank's code."""
    m = _LAUNCHER_ABORT.search(report)
    return m.group(0).splitlines()[0].split("] ", 1)[-1].strip() if m else None


def open_mpi_failed(report: str) -> str | None:
    """What Open MPI's own runtime did, told, when it failed inside itself (a daemon
    lost, :func:`lost_daemon`, or prterun aborted, :func:`launcher_abort`); else None."""
    lost = lost_daemon(report)
    if lost is not None:
        return str(lost)
    abort = launcher_abort(report)
    return f"Open MPI's launcher aborted ({abort})" if abort is not None else None


def lost_daemon(report: str) -> LostDaemon | None:
    """The node whose Open MPI daemon the launcher lost (its box "PRTE has lost
    communication with a remote daemon"), or None. Under Slurm, srun started the
    daemons, so its "node2: task 0: Segmentation fault" is the daemon's end, not rank 0's."""
    m = _LOST_DAEMON.search(report)
    if m is None:
        return None
    node = m.group(1)
    said = re.search(rf"srun: error: {re.escape(node)}: tasks? [\d,\-]+: (.+)$", report, re.M)
    words = said.group(1).strip() if said else ""
    how = killed_by(_SIGNAL_WORDS[words]) if words in _SIGNAL_WORDS else words
    return LostDaemon(node, how)


def killed_by(number: int) -> str:
    """``9`` -> ``"killed by SIGKILL"``."""
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


# signal.strsignal's words ("Killed", "Segmentation fault") -> the signal's number
_SIGNAL_WORDS = {w: int(s) for s in signal.Signals if (w := signal.strsignal(s))}
_WORDS = "|".join(re.escape(w) for w in sorted(_SIGNAL_WORDS, key=len, reverse=True))
# a job script's shell on its command that a signal ended: sh (dash) writes the signal's
# words alone on a line, bash "job.sh: line 9: 3843 Segmentation fault   mpiexec -n 4 ..."
_SHELL_KILLED = re.compile(
    rf"^(?:(?P<words>{_WORDS})(?: \(core dumped\))?|.*line \d+: +\d+ (?P<bash>{_WORDS})"
    r"(?:\s+\(core dumped\))?\s+(?:\S*/)?(?:mpiexec|mpirun|prterun)\b.*)$",
    re.M,
)


def launcher_signal(output: str) -> int | None:
    """The signal that ended a batch job's launcher (mpiexec, the job script's foreground
    command), as the script's shell wrote it in the job's output; else None."""
    m = _SHELL_KILLED.search(output)
    return _SIGNAL_WORDS[m.group("words") or m.group("bash")] if m else None


# PRRTE's process watch (PRTE_MCA_odls_base_verbose, set for fault-tolerant jobs: the
# job goes on when a rank dies, so the launcher writes no report of it)
_ODLS_PID = re.compile(r"odls:wait_local_proc child process (\[[^\]]+\]) pid (\d+) terminated")
_ODLS_SIGNAL = re.compile(
    r"odls:waitpid_fired child process (\[[^\]]+\]) terminated with signal (.+)$"
)
_ODLS_EXIT = re.compile(r"odls:waitpid_fired child (\[[^\]]+\]) exit code (-?\d+)")


def exits(output: str) -> dict[int, str]:
    """``{pid: how it ended}`` for each process PRRTE's process watch saw end (a
    fault-tolerant job's launcher log): ``"killed by SIGKILL"``, ``"exit code 3"``."""
    pids: dict[str, int] = {}
    how: dict[str, str] = {}
    for line in output.splitlines():
        if "odls:" not in line:
            continue
        if m := _ODLS_PID.search(line):
            pids[m.group(1)] = int(m.group(2))
        elif m := _ODLS_SIGNAL.search(line):
            words = m.group(2).strip()
            how[m.group(1)] = (
                killed_by(_SIGNAL_WORDS[words]) if words in _SIGNAL_WORDS else f"killed ({words})"
            )
        elif m := _ODLS_EXIT.search(line):
            how.setdefault(m.group(1), f"exit code {m.group(2)}")
    return {pids[name]: why for name, why in how.items() if name in pids}


_FAULTHANDLER_FRAME = re.compile(r'File "([^"]*)", line (\d+) in (.*)')


def faulthandler_frames(dump: str) -> list[dict]:
    """The main thread's frames from a ``faulthandler`` dump, outermost first.

    The main thread is the one running the cell (IPython's ``interactiveshell.py``
    is on its stack); frames from IPython's ``run_code`` outwards are the engine's
    own machinery and are dropped. Each frame: ``file``, ``line``, ``name``.
    """
    blocks = [b for b in dump.strip().split("\n\n") if b.strip()]
    main = next((b for b in blocks if "interactiveshell.py" in b), blocks[-1] if blocks else "")
    frames = []
    for line in main.splitlines():  # innermost first
        if "IPython/core/interactiveshell.py" in line:
            break
        m = _FAULTHANDLER_FRAME.search(line)
        if m:
            frames.append({"file": m.group(1), "line": int(m.group(2)), "name": m.group(3)})
    frames.reverse()
    return frames
