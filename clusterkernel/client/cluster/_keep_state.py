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
from clusterkernel.client.cluster._kept_login import Claim
from clusterkernel.client.errors import ClusterError


class Keeping:
    """The keep time and the takeover record of one cluster (see the module)."""

    def __init__(self, keep: bool | str | float | None, claim: Claim | None = None) -> None:
        self._keep = _kept_records.parse_keep(keep)  # seconds, inf, or None: not kept
        # from outside the cluster: this session's hold on the record on the login node
        self._claim = claim
        self._replaced: dict | None = claim.replaced if claim is not None else None
        self._taken_over_by: dict | None = None

    @classmethod
    def claimed(cls, cluster_id: str | None, force: bool, ssh: Any = None) -> tuple[Keeping, dict]:
        """The keep state of the kept cluster an attach takes, claimed by this session
        (``force``: even from a live one), and its record; ``ssh``: the login node (a
        ``Login``) of a cluster started from outside. A :class:`ClusterError` says why
        none can be."""
        if ssh is None:
            record = _kept_records.to_attach(cluster_id)
            keeping = cls(_keep_of(record))
            keeping.claim(record["run_dir"], force)
            return keeping, record
        claim = Claim.attach(ssh, cluster_id, force)
        return cls(_keep_of(claim.record), claim), claim.record

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
        if self._keep is None:
            return
        record = _kept_records.new_record(cluster, settings, guard_pid)
        login = getattr(cluster.launcher, "login", None)
        if login is not None:  # beside the guard on the login node, held from here
            self._claim = Claim.started(login, record)
        else:
            _kept_records.write(cluster.run_dir, record)

    def note(self, run_dir: str, fields: dict) -> None:
        """Set ``fields`` in a kept cluster's record (new ranks after a restart or a
        respawn, who started it), here or, from outside, on the login node; a cluster not
        kept has no record."""
        if self._claim is not None:
            self._claim.update(fields)
        elif self._keep is not None:
            _kept_records.update(run_dir, fields)

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
        if self._claim is not None:
            self.stopped()
        else:
            _kept_records.release(run_dir)

    def stopped(self) -> None:
        """This session no longer drives the cluster (stopped, or let go): a hold on its
        record on the login node ends (from outside the cluster)."""
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.close()

    def taken_over(self, run_dir: str | None) -> dict | None:
        """The session that has taken over the kept cluster in ``run_dir`` since this one
        claimed it (noted as ``taken_over_by``; the cluster must let go), or None."""
        if self._keep is None or run_dir is None:
            return None
        if self._claim is not None:  # its process on the login node says so
            self._taken_over_by = self._claim.taken_over()
            return self._taken_over_by
        holder = _kept_records.holder(run_dir)
        if holder is None or holder.get("pid") == os.getpid():
            return None
        self._taken_over_by = holder
        return holder


def _keep_of(record: dict) -> bool | float:
    """A record's keep time as ``Keeping`` takes it (its None: until stopped)."""
    return True if record["keep_s"] is None else record["keep_s"]
