"""Respawn dead ranks into the live job: the body of ``Cluster.respawn`` (client side).

The survivors run ``clusterkernel.rank._respawn:grow`` (ULFM shrink, spawn, merge:
see that module) while the new processes start the engines of the dead ranks under
their old engine ids; once they have registered they get their identity, torchrun's
environment (and with ``torch=True`` a new default group of N ranks), the live
dashboard's stream, and, with ``source``, a copy of that rank's variables.

Example::

    report = respawn(cluster, engines, source=0)
    report.ranks, report.seconds, report.skipped    # [2], 3.1, {"gen": "generator: ..."}
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ipyparallel as ipp

from clusterkernel.client.errors import ClusterError, format_ranks
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster
    from clusterkernel.client.cluster._lifecycle import Engines


@dataclass
class Respawned:
    """What a respawn did: the ranks back, how long it took, what was copied."""

    ranks: list[int] = field(default_factory=list)
    seconds: float = 0.0
    source: int | None = None
    copied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    models: int = 0  # DataParallel models re-attached on the N ranks
    from_snapshot: bool = False
    ddp: list[str] = field(default_factory=list)  # DDP models wrapped again on the new group

    def summary(self) -> str:
        """One paragraph for the notebook."""
        if not self.ranks:
            return "No rank has died: nothing to respawn."
        text = f"Rank {format_ranks(self.ranks)} respawned in {self.seconds:.1f}s"
        if self.from_snapshot:
            return text + f"; {len(self.copied)} variables loaded from its own last snapshot."
        if self.source is None:
            return text + " with an empty namespace (--from R copies a rank's variables)."
        text += (
            f"; {len(self.copied)} variables copied from rank {self.source} "
            f"({self.bytes / 2**20:.1f} MiB)"
        )
        if self.models:
            text += f"; {self.models} DataParallel model(s) attached to all ranks again"
        if self.ddp:
            text += f"; DDP model(s) {', '.join(self.ddp)} wrapped again on the new group"
        if self.skipped:
            text += "; not copied (cannot be pickled): " + ", ".join(
                f"{name} ({why.split(':')[0]})" for name, why in sorted(self.skipped.items())
            )
        return text + "."


def check(cluster: Cluster, source: int | None) -> list[int]:
    """The dead ranks to respawn; a clear error for what cannot be done (nothing started)."""
    if not cluster.running:
        raise ClusterError("The cluster is not running; nothing to respawn (%mpi start).")
    if not cluster.fault_tolerant or cluster.launcher.kind != "mpiexec":
        raise ClusterError(
            "Respawning needs ranks that outlive a dead rank: start them with "
            "%mpi start -n N --fault-tolerant (Cluster(n=N, fault_tolerant=True)), "
            "on mpiexec with Open MPI; %mpi restart starts a full set from nothing."
        )
    if cluster.launcher.runtime.flavor == "mpich":
        raise ClusterError("Respawning uses Open MPI's ULFM; this MPI is MPICH.")
    live = cluster.live_ranks
    dead = sorted(cluster.dead)
    if source is not None:
        if isinstance(source, bool) or not isinstance(source, int):
            raise ValueError(f"source must be a rank number, got {source!r}")
        if not 0 <= source < cluster.n:
            raise ValueError(f"--from {source}: ranks are 0..{cluster.n - 1}.")
        if source not in live:
            raise ValueError(
                f"--from {source}: rank {source} is dead; copy from a live rank "
                f"({format_ranks(live)})."
            )
    return dead


def _command(engines: Engines, rank: int, root: int) -> list[str]:
    """The new process for ``rank``: this package's joiner, then the engine it replaces."""
    engine_set = engines.engine_set
    program = [*engine_set.program, *engine_set.program_args]
    hosts = [info["host"] for info in engines.rank_info.values()]
    host = engines.rank_info[rank]["host"]
    same = sorted(r for r, info in engines.rank_info.items() if info["host"] == host)
    return [
        sys.executable,
        "-m",
        "clusterkernel.rank._respawn",
        str(rank),
        str(len(hosts)),
        str(same.index(rank)),
        str(len(same)),
        str(root),
        "--",
        *program,
        f"--IPEngine.id={engines.engine_of[rank]}",
    ]


def _mpi_host(cluster: Cluster, engines: Engines, rank: int) -> str:
    """The name MPI knows ``rank``'s host by: the ``--hosts`` entry it was placed on (ranks
    fill the hosts in order), else the name the rank reported."""
    names = list(dict.fromkeys(engines.rank_info[r]["host"] for r in sorted(engines.rank_info)))
    given = [host for host, _ in getattr(cluster.launcher, "hosts", None) or []]
    reported = engines.rank_info[rank]["host"]
    if len(given) == len(names):
        return given[names.index(reported)]
    return reported


def respawn(
    cluster: Cluster,
    engines: Engines,
    dead: list[int],
    source: int | None,
    timeout: float,
    from_snapshot: bool = False,
) -> Respawned:
    """Start ``dead`` again in the live job (see the module); raises ClusterError on failure."""
    t0 = time.monotonic()
    live = [r for r in cluster.ranks if r not in dead]
    root = live[0]
    commands = [_command(engines, r, root) for r in dead]
    # on one machine MPI places the new process here; across hosts, on the dead one's
    hosts = [_mpi_host(cluster, engines, r) if cluster.launcher.multi_node else None for r in dead]
    grow = cluster.view(live).apply_async(
        rank_call, "clusterkernel.rank._respawn:grow", dead, commands, hosts, root
    )
    wanted = {engines.engine_of[r]: r for r in dead}
    client = engines.client
    assert client is not None
    deadline = t0 + timeout
    while not set(wanted) <= set(client.ids) or not grow.ready():
        if grow.ready():
            grow.get()  # raises the survivors' error
        if time.monotonic() > deadline:
            raise ClusterError(
                f"Rank {format_ranks(dead)} did not come back within {timeout:.0f}s; "
                "%mpi restart starts a full set."
            )
        time.sleep(0.05)
    try:
        grow.get(timeout=max(1.0, deadline - time.monotonic()))
    except ipp.error.CompositeError as e:
        raise ClusterError(f"Respawning rank {format_ranks(dead)} failed: {e}") from None
    engines.respawned(sorted(wanted))
    cluster.ranks_respawned(dead)
    report = Respawned(ranks=dead, source=source)
    if source is not None:
        report = _copy(cluster, report, source, dead)
        report.models = _rebuild(cluster)
        report.ddp = _on_all(cluster, "clusterkernel.torchdist._rewrap:rewrap_namespace")
    elif from_snapshot:
        from clusterkernel.client.cluster import _snapshot

        loaded = _snapshot.restore(cluster, None, dead)  # re-attaches the models too
        report.copied = sorted({n for res in loaded.values() for n in res["restored"]})
        report.from_snapshot = True
    else:
        report.models = _rebuild(cluster)
    report.seconds = time.monotonic() - t0
    return report


def _on_all(cluster: Cluster, target: str):
    """``target`` (a collective rank-side step of the respawn) on every rank: rank 0's result."""
    ar = cluster.view(cluster.ranks).apply_async(rank_call, target)
    try:
        return ar.get(timeout=120)[0]
    except ipp.error.CompositeError as e:
        raise ClusterError(f"Respawn: {target} failed: {e}") from None


def _rebuild(cluster: Cluster) -> int:
    """DataParallel models re-attached on every rank (how many)."""
    return len(_on_all(cluster, "clusterkernel.rank._respawn:rebuild"))


def _copy(cluster: Cluster, report: Respawned, source: int, dead: list[int]) -> Respawned:
    ar = cluster.view([source, *dead]).apply_async(
        rank_call, "clusterkernel.rank._respawn:copy_namespace", source, dead
    )
    try:
        results = ar.get(timeout=300)
    except ipp.error.CompositeError as e:
        raise ClusterError(f"Copying rank {source}'s variables failed: {e}") from None
    mine = results[0]
    report.copied = mine["copied"]
    report.skipped = mine["skipped"]
    report.bytes = mine["bytes"]
    return report


def death_notice(cluster: Cluster, new: list[int]) -> str:
    """What the first cell after ranks died says (with ``respawn=True``: brings them back)."""
    dead = cluster.dead
    causes: dict[str, list[int]] = {}
    for r in new:
        causes.setdefault(dead[r], []).append(r)
    why = "; ".join(f"rank {format_ranks(rs)}: {w}" for w, rs in causes.items())
    head = f"Rank {format_ranks(new)} died ({why})"
    if cluster.auto_respawn:
        return f"{head}. {after_death(cluster)}"
    live = cluster.live_ranks
    return (
        f"{head}; this cell runs on ranks {format_ranks(live)}. %mpi respawn --from "
        f"{live[0]} brings {'it' if len(new) == 1 else 'them'} back with rank {live[0]}'s "
        "variables (cluster.respawn(source=...))."
    )


def after_death(cluster: Cluster) -> str:
    """``respawn=True``: bring the dead back from the lowest live rank; what happened."""
    try:
        return cluster.respawn(source=cluster.live_ranks[0]).summary()
    except (ClusterError, ValueError) as e:
        return f"Respawning failed: {e}"
