"""A cluster's keep state: how long its ranks outlive it, and who else drove them (client side).

:class:`Keeping` is the part of a :class:`~clusterkernel.Cluster` that owns what
``keep=`` and ``attach`` make of it: the keep time, the session an ``attach(force=True)``
took the cluster over from (``replaced``) and the session that took it over from this
one (``taken_over_by``). It writes and claims the kept record (``_kept_records``: the record,
list and claim, which it leaves as functions) at the moments the cluster tells it, and
it answers whether another session has taken over; the cluster then lets its ranks go.
Its fields are its own: no other module writes or reads them
(``tests/cluster/test_ownership.py``).

Example::

    keeping = Keeping("2h")
    (keeping.keep, keeping.replaced, keeping.taken_over_by)   # (7200.0, None, None)
    keeping.taken_over(None)                                  # None: nothing runs
"""

from __future__ import annotations

import os
from typing import Any

from clusterkernel.client.cluster import _kept_records
from clusterkernel.client.errors import ClusterError


class Keeping:
    """The keep time and the takeover record of one cluster (see the module)."""

    def __init__(self, keep: bool | str | float | None) -> None:
        self._keep = _kept_records.parse_keep(keep)  # seconds, inf, or None: not kept
        self._replaced: dict | None = None
        self._taken_over_by: dict | None = None

    @property
    def keep(self) -> float | None:
        """Seconds the ranks stay without a client (``inf``: until stopped), or None:
        nothing outlives the process that started them."""
        return self._keep

    @property
    def replaced(self) -> dict | None:
        """The session ``attach(force=True)`` took this cluster over from (pid, host), or None."""
        return self._replaced

    @property
    def taken_over_by(self) -> dict | None:
        """The session that took this kept cluster's place (pid, host), or None."""
        return self._taken_over_by

    def started(self, cluster: Any, settings: dict, guard_pid: int | None) -> None:
        """A kept ``cluster`` has started: write its record (``settings``: what ``attach``
        needs to make it again; ``guard_pid``: its guard process)."""
        if self._keep is not None:
            _kept_records.write(
                cluster.run_dir, _kept_records.new_record(cluster, settings, guard_pid)
            )

    def ranks_changed(self, run_dir: str, rank_info: dict) -> None:
        """A restart or a respawn made new rank processes: a kept record names them."""
        if self._keep is not None:
            _kept_records.update(run_dir, {"rank_info": rank_info})

    def claim(self, run_dir: str, force: bool) -> None:
        """This session drives the kept cluster in ``run_dir`` from now on (``force``: even
        if another does; it is noted in ``replaced``)."""
        try:
            self._replaced = _kept_records.claim(run_dir, force)
        except ValueError as e:
            raise ClusterError(str(e)) from None

    def release(self, run_dir: str) -> None:
        """This session lets go of the kept cluster in ``run_dir``; refused, saying what to
        do, for a cluster that is not kept (no one could reach its ranks)."""
        if self._keep is None:
            raise ClusterError(
                "This cluster was not started with keep: detaching would leave ranks no one "
                "can reach. Stop it (%mpi stop), or start with --keep 2h (keep='2h')."
            )
        _kept_records.release(run_dir)

    def taken_over(self, run_dir: str | None) -> dict | None:
        """The session that has taken over the kept cluster in ``run_dir`` since this one
        claimed it (noted as ``taken_over_by``; the cluster must let go), or None."""
        if self._keep is None or run_dir is None:
            return None
        holder = _kept_records.holder(run_dir)
        if holder is None or holder.get("pid") == os.getpid():
            return None
        self._taken_over_by = holder
        return holder
