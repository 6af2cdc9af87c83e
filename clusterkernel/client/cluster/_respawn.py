"""Respawn dead ranks into the live job: the body of ``Cluster.respawn`` (client side).

The survivors run ``_targets.RESPAWN_GROW`` (ULFM shrink, spawn, merge:
see that module) while the new processes start the engines of the dead ranks under
their old engine ids; once they have registered they get their identity, torchrun's
environment (and with ``torch=True`` a new default group of N ranks), the live
dashboard's stream, and, with ``source``, a copy of that rank's variables.

Example::

    report = respawn(cluster, engines, source=0)
    report.ranks, report.seconds, report.skipped    # [2], 3.1, {"gen": "generator: ..."}
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import ipyparallel as ipp
import psutil

from clusterkernel.client.cluster import _rank_faults
from clusterkernel.client.cluster._jobreport import death_cause, job_report
from clusterkernel.client.cluster._torch import subgroups_note
from clusterkernel.client.errors import ClusterError, format_ranks
from clusterkernel.protocol import _targets
from clusterkernel.protocol._procs import alive, new_ranks
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster
    from clusterkernel.client.cluster._lifecycle import Engines


class RespawnError(ClusterError):
    """A respawn that did not bring the ranks back. ``died``: ranks that died during it,
    with the cause; ``ended``: why the whole MPI job ended meanwhile, if it did; for the
    cluster to record (its helpers report, it acts)."""

    def __init__(
        self, message: str, died: dict[int, str] | None = None, ended: str | None = None
    ) -> None:
        super().__init__(message)
        self.died = died or {}
        self.ended = ended


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
    groups: list[str] = field(default_factory=list)  # names of subgroups made again
    ddp: list[str] = field(default_factory=list)  # DDP models wrapped again on the new group
    kept: dict[str, int] = field(default_factory=dict)  # torchdist.Keeper restored: its step

    def summary(self) -> str:
        """One paragraph for the notebook."""
        if not self.ranks:
            return "No rank has died: nothing to respawn."
        who = f"Rank {format_ranks(self.ranks)} respawned"
        took = f"in {self.seconds:.1f} s"
        if self.from_snapshot:
            return f"{who} {took}; {len(self.copied)} variables loaded from its own last snapshot."
        if self.source is None:
            return (
                f"{who} {took} with an empty namespace (--from R copies a rank's "
                f"variables){subgroups_note(self.groups)}."
            )
        text = (
            f"{who} from rank {self.source} {took}; {len(self.copied)} variables copied "
            f"({self.bytes / 2**20:.1f} MiB)"
        )
        if self.models:
            text += f"; {self.models} DataParallel model(s) attached to all ranks again"
        text += subgroups_note(self.groups)
        if self.ddp:
            text += f"; DDP model(s) {', '.join(self.ddp)} wrapped again on the new group"
        if self.kept:
            text += "; rebuilt on the new group from their last save: " + ", ".join(
                f"{name} (step {step})" for name, step in self.kept.items()
            )
        if self.skipped:
            text += "; not copied (cannot be pickled): " + ", ".join(
                f"{name} ({why.split(':')[0]})" for name, why in sorted(self.skipped.items())
            )
        return text + "."


def check(cluster: Cluster, source: int | None) -> list[int]:
    """The dead ranks to respawn; a clear error for what cannot be done (nothing started)."""
    if not cluster.running:
        raise ClusterError("The cluster is not running; nothing to respawn (%mpi start).")
    # the launchers that start fault-tolerant ranks do it with an mpiexec (`runtime`)
    runtime = getattr(cluster.launcher, "runtime", None)
    if not cluster.fault_tolerant or runtime is None:
        raise ClusterError(
            "Respawning needs ranks that outlive a dead rank: start them with "
            "%mpi start -n N --fault-tolerant (Cluster(n=N, fault_tolerant=True)), "
            "with Open MPI; %mpi restart starts a full set from nothing."
        )
    if runtime.flavor == "mpich":
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


def _command(engines: Engines, rank: int, root: int | str) -> list[str]:
    """The new process for ``rank``: this package's joiner, then the engine it replaces."""
    engine_set = engines.engine_set
    program = [*engine_set.program, *engine_set.program_args]
    hosts = [info["host"] for info in engines.rank_info.values()]
    host = engines.rank_info[rank]["host"]
    same = sorted(r for r, info in engines.rank_info.items() if info["host"] == host)
    return [
        program[0],  # the ranks' python: from outside the cluster not this one's path
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


def _mpi_host(cluster: Cluster, engines: Engines, rank: int) -> str | None:
    """The name MPI knows ``rank``'s host by: the ``--hosts`` entry it was placed on (ranks
    fill the hosts in order), else the name the rank reported. In a scheduler's job
    (no ``--hosts``), the dead rank's node while a survivor shows it is up, else None:
    wherever the job has room (the node may have died with the rank)."""
    names = list(dict.fromkeys(engines.rank_info[r]["host"] for r in sorted(engines.rank_info)))
    given = [host for host, _ in getattr(cluster.launcher, "hosts", None) or []]
    reported = engines.rank_info[rank]["host"]
    if len(given) == len(names):
        return given[names.index(reported)]
    if getattr(cluster.launcher, "system", None) is not None:  # a scheduler's job
        alive = {engines.rank_info[r]["host"] for r in cluster.live_ranks}
        return reported if reported in alive else None
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
        rank_call,
        _targets.RESPAWN_GROW,
        dead,
        commands,
        hosts,
        root,
        join_timeout=_join_timeout(timeout),
    )
    wanted = {engines.engine_of[r]: r for r in dead}
    client = engines.client
    assert client is not None
    watch = _Watch(cluster, engines, dead, live)
    deadline = t0 + timeout
    while not set(wanted) <= set(client.ids) or not grow.ready():
        failed = watch.failed(grow)
        if failed is None and time.monotonic() > deadline:
            failed = f"rank {format_ranks(dead)} did not join within {timeout:.0f}s"
        if failed is not None:
            watch.give_up(grow)
            died = dict.fromkeys(watch.lost, "it died while a respawn ran")
            ended = f"The MPI job ended during a respawn: {failed}." if watch.ended else None
            raise RespawnError(watch.told(failed), died, ended)
        time.sleep(0.05)
    engines.respawned(sorted(wanted))
    cluster.ranks_respawned(dead)
    report = Respawned(ranks=dead, source=source)
    if from_snapshot and source is None:
        from clusterkernel.client.cluster import _snapshot

        loaded = _snapshot.restore_on(cluster, None, dead)  # re-attaches the models too
        report.copied = sorted({n for res in loaded.values() for n in res["restored"]})
        report.from_snapshot = True
    else:
        if source is not None:
            report = _copy(cluster, report, source, dead)
        report.models = _rebuild(cluster)
        # the survivors' subgroups too (a new rank with no copy binds no name to one)
        rewrapped = _on_all(cluster, _targets.REWRAP_NAMESPACE)
        report.groups, report.ddp = rewrapped["groups"], rewrapped["ddp"]
        if source is not None:
            report.kept = _on_all(cluster, _targets.KEEP_RESTORE)
    report.seconds = time.monotonic() - t0
    return report


def _join_timeout(timeout: float) -> float:
    """How long the survivors wait for the new processes to join MPI: not the
    whole ``timeout`` (a new process that died before it joined is seen only by this
    wait where it ran on another machine), and ended before it, by themselves."""
    return min(30.0, max(3.0, timeout - 2))


class _Watch:
    """What can go wrong while the new processes join: one dies before it has joined (seen
    here when MPI started it on this machine), a survivor dies, the survivors' ``grow``
    fails; and what is left to clean up then."""

    def __init__(self, cluster: Cluster, engines: Engines, dead: list[int], live: list[int]):
        self.cluster, self.engines, self.dead, self.live = cluster, engines, dead, live
        self.new: dict[int, psutil.Process] = {}  # rank -> its new process (on this machine)
        self.lost: list[int] = []  # survivors that died meanwhile
        self.ended = False  # the whole MPI job ended meanwhile
        self._next_look = 0.0

    def failed(self, grow) -> str | None:
        """Why the respawn cannot finish, or None while it may."""
        if self.cluster.job_ended():  # before the survivors' errors: it is the cause
            self.ended = True
            return self._job_ended()
        if grow.ready():
            try:
                grow.get()
            except ipp.error.CompositeError as e:
                # a survivor's death fails the others' grow (MPI_ERR_PROC_FAILED) about
                # when the controller hears of it: that death is the news
                until = time.monotonic() + (2.0 if "PROC_FAILED" in str(e) else 0.0)
                while not self._survivors_lost() and time.monotonic() < until:
                    time.sleep(0.1)
                if self.lost:
                    return self._survivors_died()
                return _rank_errors(self.cluster, e)
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + 0.25
        if self._survivors_lost():
            return self._survivors_died()
        ids = set(cast(ipp.Client, self.engines.client).ids)  # connected while ranks run
        self._find_new()
        gone = [
            r
            for r, proc in self.new.items()
            if not alive(proc) and self.engines.engine_of[r] not in ids
        ]
        if gone:
            return f"the new process of rank {format_ranks(gone)} died before it joined"
        return None

    def _survivors_lost(self) -> list[int]:
        ids = set(cast(ipp.Client, self.engines.client).ids)  # connected while ranks run
        self.lost = [r for r in self.live if self.engines.engine_of[r] not in ids]
        return self.lost

    def _survivors_died(self) -> str:
        said = f"rank {format_ranks(self.lost)} died while the respawn ran"
        failed = self._open_mpi_failed()
        return f"{said}: {failed}" if failed is not None else said

    def _job_ended(self) -> str:
        report = job_report(self.engines.output(lines=200))
        why = self._open_mpi_failed(report) or death_cause(report)
        return f"the MPI job ended{f': {why}' if why else ''}"

    def _open_mpi_failed(self, report: str | None = None) -> str | None:
        if report is None:
            report = job_report(self.engines.output(lines=200))
        return _rank_faults.open_mpi_failed(self.cluster, report)

    def _find_new(self) -> None:
        for rank, proc in new_ranks(self.engines.processes()):
            if rank in self.dead and rank not in self.new:
                self.new[rank] = proc

    def give_up(self, grow) -> None:
        """Free the survivors (SIGINT ends their wait for the new processes), end the new
        processes, and record the survivors that died."""
        if not grow.ready():
            alive = [r for r in self.live if r not in self.lost]
            try:
                self.cluster.signal(signal.SIGINT, alive)
                grow.wait(15)
            except Exception:  # a survivor gone meanwhile: what answers is freed
                pass
        self._find_new()
        for proc in self.new.values():
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(list(self.new.values()), timeout=5)

    def told(self, what: str) -> str:
        """The user's error: what happened, what is left, what to do."""
        if self.ended:
            return (
                f"Respawning rank {format_ranks(self.dead)} failed: {what}. All ranks are "
                "gone; %mpi restart (cluster.restart()) starts a full set."
            )
        dead = sorted({*self.dead, *self.lost})
        live = [r for r in self.live if r not in self.lost]
        return (
            f"Respawning rank {format_ranks(self.dead)} failed: {what}. Ranks "
            f"{format_ranks(live)} run on with their variables; "
            f"{'rank ' + str(dead[0]) + ' is' if len(dead) == 1 else 'ranks ' + format_ranks(dead) + ' are'}"
            " still dead. %mpi respawn (--from "
            f"{live[0]}) tries again; %mpi restart starts a full set."
        )


def _rank_errors(cluster: Cluster, err: ipp.error.CompositeError) -> str:
    """The survivors' errors, one line per distinct message, with their ranks."""
    said: dict[str, list[int]] = {}
    for ename, evalue, _tb, info in err.elist:
        eid = (info or {}).get("engine_id")
        rank = next((r for r, e in cluster.engine_of.items() if e == eid), -1)
        said.setdefault(f"{ename}: {evalue}", []).append(rank)
    if len(said) == 1:  # every survivor says the same
        return next(iter(said)).removeprefix("RuntimeError: ")
    return "; ".join(f"rank {format_ranks(sorted(rs))}: {m}" for m, rs in said.items())


def _on_all(cluster: Cluster, target: str):
    """``target`` (a collective rank-side step of the respawn) on every rank: rank 0's result."""
    ar = cluster.view(cluster.ranks).apply_async(rank_call, target)
    try:
        return ar.get(timeout=120)[0]
    except ipp.error.CompositeError as e:
        raise ClusterError(f"Respawn: {target} failed: {e}") from None


def _rebuild(cluster: Cluster) -> int:
    """DataParallel models re-attached on every rank (how many)."""
    return len(_on_all(cluster, _targets.REBUILD))


def _copy(cluster: Cluster, report: Respawned, source: int, dead: list[int]) -> Respawned:
    ar = cluster.view([source, *dead]).apply_async(rank_call, _targets.RESPAWN_COPY, source, dead)
    try:
        results = ar.get(timeout=300)
    except ipp.error.CompositeError as e:
        raise _copy_failed(cluster, e, source, dead) from None
    mine = results[0]
    report.copied = mine["copied"]
    report.skipped = mine["skipped"]
    report.bytes = mine["bytes"]
    return report


def _copy_failed(
    cluster: Cluster, err: ipp.error.CompositeError, source: int, dead: list[int]
) -> RespawnError:
    """What a failed copy says, with the ranks that died in it and the cause."""
    # a rank whose process ended meanwhile: the controller has unregistered its engine
    ids = set(cluster.client.ids)
    died = [r for r in sorted({source, *dead}) if cluster.engine_of[r] not in ids]
    causes = {r: f"it died loading rank {source}'s variables" for r in died if r != source}
    if source in died:
        causes[source] = "it died pickling its variables for a respawn"
    targets = [r for r in died if r != source]
    head = f"Copying rank {source}'s variables to rank {format_ranks(dead)} failed"
    if not died:
        return RespawnError(f"{head}: {_rank_errors(cluster, err)}.")
    gone = {*cluster.dead, *causes}
    live = [r for r in cluster.ranks if r not in gone]
    why = (
        f"rank {source} died while pickling them"
        if source in died
        else f"rank {format_ranks(targets)} died while loading them"
    )
    return RespawnError(
        f"{head}: {why} (a variable whose pickling or unpickling ends the process?). "
        f"Ranks {format_ranks(live)} run on with their variables. %mpi respawn brings rank "
        f"{format_ranks(sorted(gone))} back empty, --from R with R's variables "
        f"(del the one that kills the process first); %mpi restart starts a full set.",
        causes,
    )


def death_notice(cluster: Cluster, new: list[int]) -> str:
    """What the first cell after ranks died says (with ``respawn=True``: brings them back)."""
    dead = cluster.dead
    causes: dict[str, list[int]] = {}
    for r in new:
        causes.setdefault(dead[r], []).append(r)
    if len(causes) == 1:  # one cause for all: said once
        why = next(iter(causes))
    else:
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
