"""What is wrong with a cluster's ranks: the whole set lost, or some ranks dead (client side).

:class:`RankHealth` is the fault bookkeeping of one :class:`~clusterkernel.Cluster`,
owned by it: ``lost`` says why the whole engine set is gone (the MPI job ended), so
that every later call says to restart; ``dead`` names the ranks of a fault-tolerant
job that died while the job carries on, so that cells run on the others. The
cluster's cell runs and fault checks report what they saw through its two
reporting methods; only the cluster itself clears it (a new or forgotten set of
ranks). Reading it never changes it: ``dead`` is a copy.

Example::

    health = RankHealth()
    health.ranks_died([2], "its process exited")
    health.ranks_died([2], "later news")       # the first cause stays
    health.dead                                # {2: 'its process exited'}
    health.job_ended("The MPI job ended: rank 1 died.")
    health.restarted()                         # a full new set: nothing wrong
    (health.lost, health.dead)                 # (None, {})
"""

from __future__ import annotations


class RankHealth:
    """The lost engine set and the dead ranks of one cluster (see the module)."""

    def __init__(self) -> None:
        self._lost: str | None = None
        self._dead: dict[int, str] = {}
        self._told: set[int] = set()  # dead ranks the user has been told of

    @property
    def lost(self) -> str | None:
        """Why the whole engine set is gone (until a restart), or None."""
        return self._lost

    @property
    def dead(self) -> dict[int, str]:
        """``{rank: how it died}`` of a fault-tolerant job's dead ranks (a copy)."""
        return dict(self._dead)

    def is_dead(self, rank: int) -> bool:
        return rank in self._dead

    def why_dead(self, rank: int) -> str:
        return self._dead[rank]

    # ------------------------------------------------------------------ reports
    def job_ended(self, why: str) -> None:
        """The whole engine set is gone: ``why`` says how (the latest report wins)."""
        self._lost = why

    def ranks_died(self, ranks: list[int], why: str) -> None:
        """Ranks of a fault-tolerant job died (the job carries on); a rank's first cause stays."""
        for r in ranks:
            self._dead.setdefault(r, why)

    # ------------------------------------------------------------------ the owner's
    def started(self) -> None:
        """Ranks started: the set is not lost (the cluster's start)."""
        self._lost = None

    def restarted(self) -> None:
        """A full new set of ranks replaced the old one: nothing is wrong."""
        self._lost = None
        self._dead = {}

    def untold(self) -> list[int]:
        """Dead ranks not yet told to the user (and from now on counted as told)."""
        new = sorted(set(self._dead) - self._told)
        self._told.update(new)
        return new

    def revived(self, ranks: list[int]) -> None:
        """Dead ranks were respawned into the live job: they are alive again."""
        for r in ranks:
            self._dead.pop(r, None)
            self._told.discard(r)

    def forgotten(self) -> None:
        """The cluster no longer drives ranks (stopped or let go): none is dead.
        ``lost`` stays: why the last set went, until the next start."""
        self._dead = {}
