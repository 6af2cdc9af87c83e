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

from clusterkernel.client.errors import format_ranks
from clusterkernel.protocol import _targets
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster
    from clusterkernel.client.cluster.runner import CellRun

_ROOT = "{root}"  # the rank side puts the lowest survivor here (rank._recovery)


def recipe(cluster: Cluster, engines: Any) -> dict:
    """What a rank needs to respawn its dead peers itself: each rank's new-process command
    (``_respawn``'s, its root left to the survivors) and host."""
    from clusterkernel.client.cluster._respawn import _command, _mpi_host

    multi = cluster.launcher.multi_node
    return {
        "commands": {r: _command(engines, r, _ROOT) for r in cluster.ranks},
        "hosts": {r: _mpi_host(cluster, engines, r) if multi else None for r in cluster.ranks},
    }


def arm(cluster: Cluster, engines: Any, with_recipe: dict | None) -> None:
    """Arm the live ranks with a respawn recipe (:func:`recipe`), or disarm them (None)."""
    cluster.view(cluster.live_ranks).apply_sync(rank_call, _targets.RECOVERY_ARM, with_recipe)


class Replacing:
    """The dead ranks of one cell run replaced while it runs (see the module)."""

    def __init__(self, run: CellRun, dead: list[int], causes: dict[int, str]) -> None:
        self.run = run
        self.dead = sorted(dead)
        self.causes = causes
        self.t0 = time.monotonic()
        self.seconds: float | None = None  # from the death to the new ranks running the cell
        self.source: int | None = None
        self.cells: dict[int, Any] = {}  # rank -> the cell's AsyncResult on its new process
        self._joined: Any = None

    def poll(self) -> None:
        """Once the new engines have registered: record them and send each its side of
        the recovery; once that side is done, the cell (a new rank whose copy failed
        does not run the loop: the survivors' recovery has failed too)."""
        if self.cells:
            return
        if self._joined is not None:
            if self._joined.ready() and self._joined.successful():
                self._send_cell()
            return
        cluster = self.run.cluster
        wanted = {cluster.engine_of[r] for r in self.dead}
        if not wanted <= set(cluster.client.ids):
            return
        self.run.faults.ranks_rejoined(self.dead)
        self.source = min(r for r in cluster.ranks if r not in self.dead)
        self._joined = cluster.view(self.dead).apply_async(
            rank_call, _targets.RECOVERY_JOINED, self.source, self.dead, self.run.faults.recipe
        )

    def _send_cell(self) -> None:
        view = self.run.cluster.view
        for r in self.dead:
            self.cells[r] = view([r]).execute(self.run.code, silent=False, block=False)
        self.seconds = time.monotonic() - self.t0

    def ready(self) -> bool:
        """Whether every new rank's cell is done (True while none was started: then the
        survivors' cells decide when the cell ends)."""
        return all(ar.ready() for ar in self.cells.values())

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
        """``{rank: its new process's result or exception}`` of the replaced ranks."""
        out = {}
        for r, ar in self.cells.items():
            try:
                out[r] = ar.get(return_exceptions=True)[0]
            except Exception as e:  # noqa: BLE001 (the cell's failure, as a result)
                out[r] = e
        if self._joined is not None and not self.cells:
            try:
                self._joined.get(timeout=0)
            except Exception as e:  # noqa: BLE001 (the copy failed: say it for those ranks)
                out = dict.fromkeys(self.dead, e)
            else:  # the survivors ended before the new ranks had their copy
                out = dict.fromkeys(
                    self.dead,
                    RuntimeError("the survivors' recovery failed before this rank had its copy"),
                )
        return out

    def told(self) -> str:
        """One line: who died, how, and that the cell went on."""
        causes = {self.causes.get(r, "its process exited") for r in self.dead}
        how = next(iter(causes)) if len(causes) == 1 else "; ".join(sorted(causes))
        one = len(self.dead) == 1
        who = f"{'Rank' if one else 'Ranks'} {format_ranks(self.dead)}"
        return (
            f"{who} died ({how}) during this cell and {'was' if one else 'were'} respawned "
            f"from rank {self.source} in {self.seconds:.1f} s; the cell went on from the step "
            "that failed."
        )
