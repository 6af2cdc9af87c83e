"""Engines started by ``mpiexec`` on this machine or a host list: the ``mpiexec`` launcher (client side).

ipyparallel's ``MPIEngineSetLauncher`` runs ``mpiexec``; :class:`MpiexecLauncher`
configures it from :class:`~clusterkernel.client.launch.LaunchSettings`
(:class:`~clusterkernel.client.mpiexec.MPIRuntime` knows the flags of each MPI).

Example::

    launcher = LaunchSettings(n=4).build()      # an MpiexecLauncher
    cfg = launcher.config(env={}, run_dir=make_run_dir())
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from traitlets.config import Config

from clusterkernel.client.launch._engine_set import (
    base_config,
    current_output,
    engine_cmd,
    process_ended,
    process_signal,
    tail,
)
from clusterkernel.client.launch._registry import register
from clusterkernel.client.launch._settings import DEFAULT_RANKS
from clusterkernel.client.mpiexec import MPIRuntime, check_hosts_resolve, is_local_only, parse_hosts

if TYPE_CHECKING:
    from clusterkernel.client.launch._settings import LaunchSettings

# Ranks per core one machine is allowed before a start is refused: what a small machine
# still ran (BENCHMARKS.md, "Scale"), while a typo's huge count fails at once.
MAX_RANKS_PER_CORE_ENV = "CLUSTERKERNEL_MAX_RANKS_PER_CORE"
_MAX_RANKS_PER_CORE = 32


def local_rank_limit() -> int:
    """The most ranks a start on this machine alone may ask for (cores x the per-core cap)."""
    per_core = int(os.environ.get(MAX_RANKS_PER_CORE_ENV) or _MAX_RANKS_PER_CORE)
    return (os.cpu_count() or 1) * per_core


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
        total = sum(count or 0 for count in slots)
        n = settings.n or DEFAULT_RANKS
        if settings.n is not None and hosts and all(slots) and n > total:
            raise ValueError(
                f"{n} ranks, but hosts= gives {total} slots "
                f"({', '.join(f'{h}:{c}' for h, c in hosts)}): ask for at most {total} "
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
        n = self.settings.n
        assert n is not None  # __init__ put the count it starts there (with_ranks)
        return n

    def engines(self) -> str:
        return "mpi"

    def controller_ip(self) -> str | None:
        if self._controller_ip is not None:
            return self._controller_ip
        return "*" if self.multi_node else None

    def describe(self) -> str:
        return self.runtime.flavor

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        cfg = base_config()
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

    def ended(self, engine_set: Any) -> bool:
        return process_ended(engine_set)

    def killed_by(self, engine_set: Any) -> int | None:
        return process_signal(engine_set)

    def output(self, engine_set: Any, lines: int = 40) -> str:
        return tail(current_output(engine_set), lines)

    def waiting(self, engine_set: Any) -> str | None:
        return None

    def stopped(self, engine_set: Any, timeout: float) -> None:
        return None


register("mpiexec", MpiexecLauncher)
