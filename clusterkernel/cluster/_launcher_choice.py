"""Which launcher a :class:`~clusterkernel.Cluster` gets, from its arguments (client side).

``mpiexec`` here or on a host list, or a Slurm job; default Slurm inside an
allocation. Every argument is checked here, before anything starts, so a wrong
combination is a clear ``ValueError`` at ``Cluster(...)``.

Example::

    launcher, runtime = choose_launcher(4)          # MpiexecLauncher, the MPIRuntime
    launcher, _ = choose_launcher(8, launcher="slurm", nodes=2)
"""

from __future__ import annotations

import os

from clusterkernel.cluster._launch import Launcher, MpiexecLauncher
from clusterkernel.export._sbatch import DEFAULT_TIME
from clusterkernel.mpiexec import MPIRuntime, check_hosts_resolve, parse_hosts

LAUNCHERS = ("mpiexec", "slurm")

# Ranks per core one machine is allowed before a start is refused: 32 ranks ran on the
# 2-core test machine (BENCHMARKS.md, issue 11); 100,000 took 108 s to fail there.
MAX_RANKS_PER_CORE_ENV = "CLUSTERKERNEL_MAX_RANKS_PER_CORE"
_MAX_RANKS_PER_CORE = 32


def local_rank_limit() -> int:
    """The most ranks a start on this machine alone may ask for (cores x the per-core cap)."""
    per_core = int(os.environ.get(MAX_RANKS_PER_CORE_ENV) or _MAX_RANKS_PER_CORE)
    return (os.cpu_count() or 1) * per_core


def choose_launcher(
    n: int | None,
    hosts: str | list[str] | None = None,
    hostfile: str | None = None,
    mpiexec: str | None = None,
    *,
    launcher: str | None = None,
    nodes: int | None = None,
    partition: str | None = None,
    time: str | None = DEFAULT_TIME,
    account: str | None = None,
    slurm_args: tuple[str, ...] | list[str] = (),
    controller_ip: str | None = None,
    fault_tolerant: bool = False,
) -> tuple[Launcher, MPIRuntime | None]:
    """The launcher for these :class:`~clusterkernel.Cluster` arguments, and the MPI
    runtime it uses (None for Slurm, whose ``srun`` starts the ranks)."""
    from clusterkernel.cluster import _slurm

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
        slurm = _slurm.SlurmLauncher(
            n,
            nodes=nodes,
            partition=partition,
            time=time,
            account=account,
            slurm_args=slurm_args,
            controller_ip=controller_ip,
        )
        return slurm, None
    if nodes or partition or account or slurm_args:
        raise ValueError("nodes=, partition=, account= and slurm_args= are for launcher='slurm'.")
    parsed = parse_hosts(hosts)
    slots = [count for _, count in parsed]
    if n is not None and parsed and all(slots) and n > sum(slots):
        raise ValueError(
            f"{n} ranks, but hosts= gives {sum(slots)} slots "
            f"({', '.join(f'{h}:{c}' for h, c in parsed)}): ask for at most {sum(slots)} "
            "ranks, or give the hosts more slots."
        )
    check_hosts_resolve(parsed)
    runtime = MPIRuntime.detect(mpiexec)
    local = MpiexecLauncher(
        runtime,
        n or 4,
        parsed,
        hostfile,
        fault_tolerant=fault_tolerant,
        controller_ip=controller_ip,
    )
    limit = local_rank_limit()
    if not local.multi_node and local.n > limit:
        raise ValueError(
            f"{local.n} ranks on this machine alone: at most {limit} "
            f"({os.cpu_count()} cores x {limit // (os.cpu_count() or 1)}) are started here. "
            f"Ask for fewer, spread them with hosts=/--hosts or Slurm, or raise the cap with "
            f"{MAX_RANKS_PER_CORE_ENV}."
        )
    return local, runtime
