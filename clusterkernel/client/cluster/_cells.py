"""A cluster's cells: running one on its ranks, and the last profile (client side).

:class:`Cells` is the part of a :class:`~clusterkernel.Cluster` that owns what its
cells leave behind: the name of the cell that runs now (the same on every rank: the
dashboard's runs, ``CELL_LABEL``; ``Cluster.view`` labels its views with it) and the
:class:`~clusterkernel.client.profile.Profile` of the last profiled cell
(``cluster.profile_result``). :meth:`Cells.run` is the body of ``Cluster.run`` and
:meth:`Cells.profile` of ``Cluster.profile``: they read the cluster through its public
API, ask the cluster's :class:`~clusterkernel.client.cluster._rankmap.RankMap` (given
at the start) which dead ranks are news, and report a cell's faults to it through the
``runner.CellFaults`` they make (a cell stuck for good: the cluster's ``restart``, given
too). The docstrings of ``Cluster.run`` and ``Cluster.profile`` are these methods'. Its
fields are its own: no other module writes or reads them (``tests/cluster/test_ownership.py``).

Example::

    cells = Cells(RankMap(), restart=lambda: None)
    (cells.label, cells.profile_result)   # (None, None): no cell has run
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clusterkernel.client.cluster import _incell, _rank_faults, _respawn
from clusterkernel.client.errors import RankError, notebook_execution_count

if TYPE_CHECKING:
    from clusterkernel.client.cluster._rankmap import RankMap
    from clusterkernel.client.cluster.runner import CellRun
    from clusterkernel.client.profile import Profile
    from clusterkernel.client.profile._kinds import ProfileKind


class Cells:
    """The running cell's name and the last profile of one cluster (see the module)."""

    def __init__(self, rank_map: RankMap, restart: Callable[[], None]) -> None:
        self._rank_map = rank_map  # the cluster's ranks: which dead ones are news, faults
        self._restart = restart  # the cluster's restart: what frees ranks stuck for good
        self._label: str | None = None
        self._profile_result: Profile | None = None
        self._armed: tuple | None = None  # the processes armed for auto-respawn in a cell
        self._recipe: dict | None = None

    @property
    def label(self) -> str | None:
        """The ranks' name of the cell that runs (or ran last), or None."""
        return self._label

    @property
    def profile_result(self) -> Profile | None:
        """The :class:`~clusterkernel.client.profile.Profile` of the last
        ``run(..., profile=True)``."""
        return self._profile_result

    def run(
        self,
        cluster: Any,
        code: str,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        block: bool = True,
        renderer=None,
        dashboard: bool = False,
        profile: bool | ProfileKind | None = False,
    ) -> CellRun:
        """Run ``code`` on the ranks, streaming each rank's output; the call behind ``%%mpi``.

        Raises :class:`RankError` naming the failing ranks, and
        :class:`CellInterrupted` on a kernel interrupt or when ``timeout``
        (default: ``self.timeout``) passes; stuck ranks are reported with their
        stacks and freed, by a restart if nothing else works.

        With ``block=False`` returns a :class:`~clusterkernel.client.cluster.runner.CellRun` at
        once; call its ``wait()`` to stream and collect.

        ``dashboard=True`` (``%%mpi --dashboard``) shows :meth:`dashboard` first
        and, when the cell has run, collects its last records into it.

        ``profile=True`` or ``"python"`` (``%%mpi --profile``; ``"torch"``: torch.profiler's
        CPU ops too, ``--profile torch``) samples every rank's Python stacks while
        the cell runs and shows, under it, each rank's top lines and what the slowest
        rank does more than the median rank; the :class:`~clusterkernel.client.profile.Profile`
        is kept as ``cluster.profile_result`` (also when the cell raised or was stopped).
        """
        from clusterkernel.client.cluster.runner import CellFaults, CellRun
        from clusterkernel.protocol.records import cell_label

        cluster.require_running()
        # the job ended between cells: a rank's death (unless fault-tolerant), or its launcher's
        ended = _rank_faults.ended_between_cells(cluster)
        if ended is not None:
            self._rank_map.mark_lost(ended)
            cluster.require_running()  # says it, and what to do
        explicit = ranks is not None
        ranks = cluster.live_ranks if ranks is None else sorted(set(ranks))
        new = self._rank_map.untold() if not explicit else []
        if new:  # a death between cells is always told, once, before the next cell
            print(_respawn.death_notice(cluster, new), file=sys.stderr)
        for r in ranks:
            cluster.engine_id(r)  # clear error for a rank that does not exist
        dash = cluster.dashboard() if dashboard else None
        if dash is not None:
            dash.show()
        # one name per cell, the same on every rank: the dashboard's runs (CELL_LABEL)
        # with the notebook's In [N]: the ranks name the cell's code after it in profiles
        self._label = cell_label(secrets.token_hex(6), notebook_execution_count())
        recipe = self._arm(cluster)
        faults = CellFaults(
            job_ended=self._rank_map.mark_lost, ranks_died=self._rank_map.mark_dead,
            ranks_stuck=lambda _ranks: self._restart(), ranks_rejoined=self._rank_map.rejoined,
            ranks_back=lambda back: _incell.ranks_back(cluster, back), recipe=recipe,
        )  # fmt: skip
        run = None
        try:
            run = CellRun(cluster, code, ranks, renderer=renderer, faults=faults, profile=profile)
            if not block:
                return run
            try:
                return run.wait(timeout=cluster.timeout if timeout is None else timeout)
            except RankError as e:
                self._rank_map.untold()  # ranks that died in this cell: its error names them
                if cluster.auto_respawn and cluster.running and self._rank_map.dead:
                    e.note = "\n".join(n for n in (e.note, _respawn.after_death(cluster)) if n)
                raise
        finally:
            if dash is not None and block:
                dash.cell_finished()
            if profile and block:
                self._profile_result = run.profile if run is not None else None

    def _arm(self, cluster: Any) -> dict | None:
        """With auto-respawn, the ranks know how to respawn a dead peer in a cell
        (``_incell.arm``; again after every change of processes); without, they do not."""
        on = bool(cluster.auto_respawn and cluster.fault_tolerant)
        key = tuple(sorted(info.get("pid") for info in cluster.rank_info.values())) if on else None
        if key != self._armed:
            engines = self._rank_map.engines
            self._recipe = _incell.recipe(cluster, engines) if on else None
            _incell.arm(cluster, engines, self._recipe)
            self._armed = key
        return self._recipe

    def profile(self, cluster: Any, action: str = "start", **options: Any) -> Profile | None:
        """``%mpi profile start|stop``: sample every rank over the cells in between.

        ``"start"`` starts every live rank's sampler (``torch=True``: torch.profiler's
        CPU ops too); ``"stop"`` ends it, shows the :class:`~clusterkernel.client.profile.
        Profile` and returns it (also kept as ``profile_result``). Misuse (stop without
        start, start twice) raises :class:`~clusterkernel.client.profile.ProfileError`.
        ``options`` go to :func:`clusterkernel.client.profile.control` (``torch``, ``hz``, ...).

        Example::

            cluster.profile("start")
            cluster.run("import time; time.sleep(0.1)")
            p = cluster.profile("stop")
        """
        from clusterkernel.client.profile import control

        cluster.require_running()
        profile = control(cluster, action, **options)
        if profile is not None:
            self._profile_result = profile
        return profile
