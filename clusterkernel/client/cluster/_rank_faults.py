"""What is wrong on a cluster's ranks, and what frees them (client side).

``Cluster``'s methods ``frames``, ``stacks``, ``dead_ranks``, ``out_of_memory``,
``signal``, ``interrupt``, ``abort_torch_groups`` and ``debug`` are this module's
functions of those names, and :func:`lost_engines` says which ranks were lost between
cells. They read the cluster through its public API and act on its ranks, but never
change it (what they find, the cluster records itself). Each rank's frames come from
its engine's control thread (works inside MPI calls and on any host), else from
``faulthandler`` for a rank on this machine whose control thread cannot answer; a job
that ended is read from the launcher's report.

Example::

    cluster.stacks([1, 3], code=cell)   # {1: "...", 3: "..."}: _rank_faults.stacks
    cluster.dead_ranks()                # None, or ([2], report)
    death_causes(cluster, [2])          # {2: "killed by SIGKILL"}
"""

from __future__ import annotations

import signal as _signal
import socket
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from clusterkernel.client.cluster import _ipp, _jobreport, _stacks
from clusterkernel.client.errors import format_ranks
from clusterkernel.protocol import _oom
from clusterkernel.protocol._names import DEBUG_REQUEST, STACK_SIGNAL

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster
    from clusterkernel.client.debug import DebugSession


def frames(
    cluster: Cluster, ranks: list[int], with_locals: bool = False, silent: Collection[int] = ()
) -> dict[int, list[dict]]:
    """Each rank's main-thread frames, outermost first, while it runs a cell.

    Works while a rank is blocked inside an MPI call and for ranks on any host
    (the engine's control thread answers). A rank that cannot answer (its
    control thread starved by C code holding the GIL; ``silent``: known not to,
    not waited for) is asked through ``faulthandler`` instead, if it runs on this
    machine; if neither works, it is missing from the result.
    """
    engines = {r: cluster.engine_id(r) for r in ranks if r not in silent}
    out = _stacks.request_frames(cluster.client, engines, with_locals=with_locals)
    missing = [r for r in ranks if r not in out]
    if missing:
        out.update(
            _stacks.faulthandler_frames(
                cluster.run_dir or "",
                missing,
                lambda rs: cluster.signal(STACK_SIGNAL, rs),
            )
        )
    return out


def stacks(
    cluster: Cluster,
    ranks: list[int],
    code: str | None = None,
    with_locals: bool = False,
    all_frames: bool = False,
    silent: Collection[int] = (),
) -> dict[int, str]:
    """Each rank's stack as text, the cell's lines first (see :meth:`frames`); a note for
    a rank that did not answer.

    ``code`` (the cell's source) fills in the text of cell lines; clusterkernel's
    own frames show only with ``all_frames``.
    """
    found = frames(cluster, ranks, with_locals, silent)
    return {
        r: _stacks.format_stack(found[r], code, all_frames=all_frames, with_locals=with_locals)
        if r in found
        else "(no stack: the rank did not answer)"
        for r in ranks
    }


def dead_ranks(cluster: Cluster) -> tuple[list[int], str] | None:
    """If the MPI job has ended, ``(ranks that died first, the launcher's report)``."""
    if not cluster.job_ended():
        return None
    report = _jobreport.job_report(cluster.job_output(lines=200))
    return _jobreport.dead_ranks(report, cluster.n), report


def lost_daemon(cluster: Cluster, report: str) -> tuple[_jobreport.LostDaemon, list[int]] | None:
    """If the launcher lost a node's Open MPI daemon (see :func:`_jobreport.lost_daemon`),
    ``(that daemon, the ranks that ran on its node)``; else None."""
    lost = _jobreport.lost_daemon(report)
    if lost is None:
        return None
    hosts = {r: str(info.get("host", "")) for r, info in cluster.rank_info.items()}
    return lost, lost.ranks(hosts)


# a launcher that dies of these crashed; any other signal was sent to it
_CRASHES = {_signal.SIGSEGV, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE}


def launcher_died(cluster: Cluster) -> str | None:
    """If a signal ended the launcher's own process (mpiexec, not a rank), what that was:
    ``"the launcher (mpiexec) crashed (killed by SIGSEGV)"``; else None. Its ranks lose
    their runtime with it; Open MPI's prterun leaves no report of its own crash (the
    launcher tells the signal: :meth:`Cluster.launcher_killed_by`)."""
    number = cluster.launcher_killed_by()
    if number is None:
        return None
    how = "crashed" if number in _CRASHES else "was ended from outside"
    return f"the launcher (mpiexec) {how} ({_jobreport.killed_by(number)})"


def open_mpi_failed(cluster: Cluster, report: str) -> str | None:
    """What the MPI runtime did when it failed inside itself: Open MPI's own report
    (:func:`_jobreport.open_mpi_failed`), else the launcher's death by a signal
    (:func:`launcher_died`); else None."""
    return _jobreport.open_mpi_failed(report) or launcher_died(cluster)


def death_causes(cluster: Cluster, ranks: list[int], wait: float = 1.0) -> dict[int, str]:
    """How each of ``ranks`` (of a fault-tolerant job, just found dead) ended: ``"killed
    by SIGKILL (signal 9)"``, ``"exit code 3"``, :data:`~._jobreport.OUT_OF_MEMORY`; from
    the launcher's log (``wait`` s at most for its line), else ``"its process exited"``."""
    pids = {r: cluster.rank_info.get(r, {}).get("pid") for r in ranks}
    deadline = time.monotonic() + wait
    while True:
        ended = _jobreport.exits(cluster.job_output(lines=100_000))
        if all(pid in ended for pid in pids.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    causes = {r: ended.get(pid, "its process exited") for r, pid in pids.items()}
    killed = [r for r, why in causes.items() if "SIGKILL" in why]
    for r in out_of_memory(cluster, killed) if killed else []:
        causes[r] = _jobreport.OUT_OF_MEMORY
    return causes


def ended_between_cells(cluster: Cluster) -> str | None:
    """If the MPI job ended while no cell watched it (a rank of a job that is not
    fault-tolerant died between cells), one line saying which rank died and how; else None."""
    dead = dead_ranks(cluster)
    if dead is None:
        return None
    ranks, report = dead
    daemon = lost_daemon(cluster, report)
    if daemon is not None:
        lost, there = daemon
        who = f"{'rank' if len(there) == 1 else 'ranks'} {format_ranks(there)}"
        return f"{lost} before this cell, and {who} with it; the MPI job ended."
    failed = open_mpi_failed(cluster, report)
    if failed is not None:
        return f"{failed[0].upper()}{failed[1:]} before this cell; the MPI job ended."
    why = _jobreport.death_cause(report)
    if "SIGKILL" in why and ranks and out_of_memory(cluster, ranks) == ranks:
        why = _jobreport.OUT_OF_MEMORY
    who = (
        f"{'Rank' if len(ranks) == 1 else 'Ranks'} {format_ranks(ranks)} died"
        if ranks
        else "The MPI job ended"
    )
    return f"{who}{f' ({why})' if why else ''} before this cell; the MPI job ended with it."


def lost_engines(
    engine_of: dict[int, int], registered: list[int], dead: dict[int, str]
) -> list[int]:
    """Ranks not yet known dead whose engines are no longer registered (``engine_of``:
    rank -> engine id; ``registered``: the client's engine ids); the cluster records them."""
    ids = set(registered)
    return [r for r, eid in engine_of.items() if eid not in ids and r not in dead]


def out_of_memory(cluster: Cluster, ranks: list[int]) -> list[int]:
    """Those of ``ranks`` (on this host) in whose memory cgroup the kernel's
    out-of-memory killer has struck since they started (see :mod:`clusterkernel.protocol._oom`)."""
    here = socket.gethostname()
    info = cluster.rank_info
    return [
        r
        for r in ranks
        if info.get(r, {}).get("host") == here and _oom.killed_since(info[r].get("oom"))
    ]


def signal(cluster: Cluster, sig: int, ranks: list[int] | None = None) -> None:
    """Send ``sig`` to the given ranks only (through each engine's nanny)."""
    ranks = cluster.live_ranks if ranks is None else ranks
    engines = [cluster.engine_id(r) for r in ranks]
    cluster.client.send_signal(int(sig), targets=engines, block=True)


def interrupt(cluster: Cluster, ranks: list[int]) -> None:
    """A kernel interrupt (SIGINT) to ``ranks``: their cells raise KeyboardInterrupt."""
    signal(cluster, _signal.SIGINT, ranks)


def abort_torch_groups(cluster: Cluster, ranks: list[int] | None = None) -> list[int]:
    """Abort the torch.distributed groups of ``ranks`` (default: live ones); the ranks
    that had one. Frees ranks blocked in a gloo or NCCL collective whose peers
    abort too; their variables stay. :meth:`torch_reinit` makes a new group.
    """
    ranks = cluster.live_ranks if ranks is None else ranks
    return _stacks.abort_torch_groups(cluster.client, {r: cluster.engine_id(r) for r in ranks})


def debug(cluster: Cluster, ranks: list[int] | None = None, timeout: float = 10.0) -> DebugSession:
    """A :class:`~clusterkernel.client.debug.DebugSession`: pdb on ``ranks``, one command at a time.

    Each rank is debugged at its ``breakpoint()`` if a running cell stopped
    there, else post-mortem on its last failed cell. Default ranks: those at a
    breakpoint, else those with a traceback. ``timeout``: seconds a command may
    take before its answer says the rank runs on.

    Example::

        try:  # ranks 1 and 3 fail: post-mortem on them
            cluster.run("x = 10 * comm.rank()\\nassert comm.rank() not in (1, 3)")
        except RankError:
            pass
        with cluster.debug(ranks=[1, 3]) as dbg:
            dbg.send("p x")      # {1: "10", 3: "30"}
    """
    from clusterkernel.client.debug import DebugSession

    cluster.require_running()
    # the debugger is handed its way to the ranks: it never imports this package
    return DebugSession(cluster, ranks, timeout=timeout, ask=_ipp.asker(cluster, DEBUG_REQUEST))
