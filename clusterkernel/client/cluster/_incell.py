"""Dead ranks replaced while their cell runs (client side, auto-respawn).

With ``%mpi start --respawn`` the ranks are armed (:func:`arm`) with the recipe of a
respawn; a guarded loop on the survivors (``Trainer.fit``, ``train.steps``) that finds a
peer dead starts the dead ranks again itself (the rank side's ``rejoin``).
A :class:`Replacing` of the cell's run sees the new engines register under the dead
ranks' engine ids, records them in the rank map, and sends each its side of the
recovery (the copy of the lowest survivor's variables) and then the cell: the new rank
runs it from the top and its guarded loop goes on from the step the survivors redo.
Its output and result stand for the dead rank's in the cell's report.

Example::

    replacing = Replacing(run, [2], {2: "killed by SIGKILL"})
    replacing.poll()         # each turn of the run's wait loop
    replacing.ready()        # the new ranks' cells are done (or none was started)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from clusterkernel.client.cluster import _ipp
from clusterkernel.client.errors import ClusterError, format_ranks
from clusterkernel.protocol import _targets
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster
    from clusterkernel.client.cluster.runner import CellRun

_ROOT = "{root}"  # the rank side puts the lowest survivor here (rank._recovery)


def recipe(cluster: Cluster, engines: Any) -> dict:
    """What a rank needs to respawn its dead peers itself: each rank's new-process command
    (``_respawn``'s, its root left to the survivors) and host, and how a fresh rank's
    torch side is set up (``_torch.ranks_up``'s GPU binding and group timeout), for the
    default group the recovery makes again where the ranks had one."""
    from clusterkernel.client.cluster._respawn import _command, _mpi_host
    from clusterkernel.client.cluster._torch import _INIT_TIMEOUT

    multi = cluster.launcher.multi_node
    return {
        "commands": {r: _command(engines, r, _ROOT) for r in cluster.ranks},
        "hosts": {r: _mpi_host(cluster, engines, r) if multi else None for r in cluster.ranks},
        "torch": {
            "gpus_per_rank": cluster.gpus_per_rank,
            "share": cluster.gpu_share,
            "timeout": _INIT_TIMEOUT,
        },
    }


def ranks_back(cluster: Cluster, ranks: list[int]) -> None:
    """After a cell whose dead ``ranks`` were replaced in it, none left dead: they are
    alive again (``cluster.ranks_respawned``). Where the recovery made the torch default
    group again (every rank in one group of all of them, DDP models wrapped on it), that
    group stays: a fresh one would leave those models on a closed group."""
    groups = list(cluster.torch_group().values())  # {} where a rank has none
    kept = all(groups) and len({(g["world_size"], g["master"]) for g in groups}) == 1
    cluster.ranks_respawned(ranks, group_kept=kept and groups[0]["world_size"] == len(groups))
    _end_strays(cluster)


def _end_strays(cluster: Cluster) -> None:
    """End the new processes of a spawn the survivors gave up on (a survivor died while
    they joined, and the next round spawned them all again): each waits in MPI for
    survivors that have moved on, never to be a rank. Those on this machine."""
    import psutil

    from clusterkernel.protocol._procs import new_ranks

    ranks = {info.get("pid") for info in cluster.rank_info.values()}
    strays = [proc for _, proc in new_ranks(cluster.processes()) if proc.pid not in ranks]
    for proc in strays:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(strays, timeout=5)


def arm(cluster: Cluster, engines: Any, with_recipe: dict | None) -> None:
    """Arm the live ranks with a respawn recipe (:func:`recipe`), or disarm them (None)."""
    cluster.view(cluster.live_ranks).apply_sync(rank_call, _targets.RECOVERY_ARM, with_recipe)


class Replacing:
    """The dead ranks of one cell run replaced while it runs (see the module). Each new
    process is sent its side of the recovery as soon as it has registered: one that
    waited for another could keep the survivors waiting for it (a source that died in
    the recovery is spawned again only once the ranks already spawned have joined)."""

    def __init__(self, run: CellRun, dead: list[int], causes: dict[int, str]) -> None:
        self.run = run
        self.dead = sorted(dead)
        self.causes = causes
        self.t0 = time.monotonic()
        self.seconds: float | None = None  # from the death to the new ranks running the cell
        self.source: int | None = None  # the rank the new ones copied from
        self.joined: dict[int, Any] = {}  # rank -> its side of the recovery (AsyncResult)
        self.identity: dict[int, Any] = {}  # rank -> its new engine's registration identity
        self.cells: dict[int, Any] = {}  # rank -> the cell's AsyncResult on its new process

    def poll(self) -> None:
        """Each new engine that has registered: record it and send it its side of the
        recovery; once that side is done, the cell (a new rank whose recovery failed does
        not run the loop: the survivors' recovery has failed too)."""
        cluster = self.run.cluster
        identities = _ipp.engine_identities(cluster.client)
        for r in self.dead:
            if r in self.cells:
                continue
            joined = self.joined.get(r)
            if joined is None and cluster.engine_of[r] in identities:
                try:
                    self.run.faults.ranks_rejoined([r])
                except ClusterError:  # it died before it answered: its next one will
                    continue
                # its identity now: a death even before the run looks again is told
                self.identity[r] = identities[cluster.engine_of[r]]
                self.joined[r] = cluster.view([r]).apply_async(
                    rank_call, _targets.RECOVERY_JOINED, self.run.faults.recipe
                )
            elif joined is not None and joined.ready() and joined.successful():
                self.source = joined.get()[0]["root"]
                self._send_cell(r)

    def _send_cell(self, rank: int) -> None:
        self.cells[rank] = self.run.cluster.view([rank]).execute(
            self.run.code, silent=False, block=False
        )
        self.seconds = time.monotonic() - self.t0

    def ready(self) -> bool:
        """Whether every new rank's side of the recovery and cell are done (True while none
        has registered: then the survivors' cells decide when the cell ends)."""
        pending = [ar for r, ar in self.joined.items() if r not in self.cells]
        return all(ar.ready() for ar in [*pending, *self.cells.values()])

    def output_ready(self) -> bool:
        return all(ar.wait_for_output(timeout=0) for ar in self.cells.values())

    def metadata(self, rank: int) -> dict | None:
        """The new process's output metadata for ``rank``, or None."""
        ar = self.cells.get(rank)
        if ar is None:
            return None
        md = ar.metadata
        return md[0] if isinstance(md, list) else md

    def results(self) -> dict[int, Any]:
        """``{rank: its new process's result or exception}`` of the ranks whose new
        process registered."""
        out = {}
        for r, joined in self.joined.items():
            ar = self.cells.get(r, joined)
            try:
                out[r] = ar.get(timeout=0, return_exceptions=True)[0]
            except Exception as e:  # noqa: BLE001 (its failure, as a result)
                out[r] = e
            if ar is joined and not isinstance(out[r], BaseException):
                out[r] = RuntimeError(  # the survivors ended before its cell was sent
                    "the survivors' cell ended before this rank had its copy"
                )
        return out

    def told(self, went_on: bool) -> str:
        """One line: who died, how, and what became of them; that the cell went on from
        the step that failed only where it did (``went_on``: the cell completed)."""
        causes = {self.causes.get(r, "its process exited") for r in self.dead}
        how = next(iter(causes)) if len(causes) == 1 else "; ".join(sorted(causes))
        one = len(self.dead) == 1
        who = (
            f"{'Rank' if one else 'Ranks'} {format_ranks(self.dead)} died ({how}) during this cell"
        )
        if len(self.cells) < len(self.dead):
            back = sorted(self.joined)
            joined = f"; rank {format_ranks(back)} joined again, but" if back else ";"
            return f"{who}{joined} the recovery inside the cell failed (below)."
        respawned = (
            f"{who} and {'was' if one else 'were'} respawned from rank {self.source} in "
            f"{self.seconds:.1f} s"
        )
        if went_on:
            return f"{respawned}; the cell went on from the step that failed."
        return f"{respawned}; the cell failed all the same (below)."

    def registered(self) -> list[int]:
        """The ranks whose new process registered (and was sent its side of the recovery)."""
        return sorted(self.joined)

    def hand_over(self, rank: int) -> str | None:
        """``rank``'s new process died in the recovery (before it ran the cell): it is no
        longer this replacement's to tell; the cause of the rank's first death, if it
        was. (One that died later in the cell stays: its output and notice are this
        replacement's, its next replacement's come after.)"""
        if rank not in self.joined or rank in self.cells:
            return None
        self.dead.remove(rank)
        self.joined.pop(rank)
        self.identity.pop(rank, None)
        return self.causes.pop(rank, "its process exited")
