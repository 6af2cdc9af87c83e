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
from clusterkernel.mpiexec import MPIRuntime, check_hosts_resolve, parse_hosts

LAUNCHERS = ("mpiexec", "slurm")


def choose_launcher(
    n: int | None,
    hosts: str | list[str] | None = None,
    hostfile: str | None = None,
    mpiexec: str | None = None,
    *,
    launcher: str | None = None,
    nodes: int | None = None,
    partition: str | None = None,
    time: str | None = "0:30:00",
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
    return local, runtime
