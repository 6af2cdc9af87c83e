"""Time inside collectives, split into moving data and waiting for other ranks.

Each rank's profile carries the comm layer's timing records of the cell
(``clusterkernel.rank._profile``; fields in ``COMM_FIELDS`` order). A collective
cannot finish on any rank before the last rank has entered it, so for the k-th call
of one collective on every rank of the group, the time from a rank's entry to the
**last arrival** is waiting for other ranks, and the rest of the call (last arrival
to its own exit) is moving data. The clocks are put on one wall clock with each
rank's ``wall0 - t0`` (on one host ``perf_counter`` is one clock already; across
hosts this is as good as the hosts' wall clocks).

Calls are matched across ranks by (op, group size) and their order, and only when
every profiled rank made the same number of them over a group of all profiled ranks:
a collective over a sub-group or a point-to-point call is counted as ``unsplit``,
as is the blocked part (``wait``) of an async call; an async call whose blocked part
was not measured (NaN: DDP's bucket all-reduces, overlapping the backward pass) is
left out.

Example::

    split = collective_split(profile.ranks)
    split[0]   # CollectiveTime(calls=25, moving=0.004, waiting=0.93, unsplit=0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# COMM_FIELDS: op, nbytes, algorithm, group_size, start, duration, wait
_OP, _NBYTES, _ALG, _GSIZE, _START, _DUR, _WAIT = range(7)


@dataclass(frozen=True)
class CollectiveTime:
    """One rank's seconds in the comm layer's calls over a cell.

    ``moving``: last arrival to exit, summed; ``waiting``: entry to the last
    arrival (the other ranks were not there yet); ``unsplit``: calls that could not
    be matched across ranks (sub-groups, point-to-point, async).

    Example::

        t = profile.collectives()[2]
        f"{t.waiting:.2f} s waiting for other ranks in {t.calls} calls"
    """

    calls: int
    moving: float
    waiting: float
    unsplit: float

    @property
    def total(self) -> float:
        """All seconds in comm calls."""
        return self.moving + self.waiting + self.unsplit


def _blocking(rec: list) -> bool:
    wait, dur = rec[_WAIT], rec[_DUR]
    if not isinstance(wait, (int, float)) or math.isnan(wait):
        return False
    return abs(wait - dur) <= 1e-9 + 1e-6 * dur


def _blocked(rec: list) -> float:
    """Seconds the caller was blocked in one call (0 where not measured)."""
    wait = rec[_WAIT]
    if not isinstance(wait, (int, float)) or math.isnan(wait):
        return 0.0
    return float(rec[_DUR]) if _blocking(rec) else float(wait)


def _point_to_point(op: str) -> bool:
    return "send" in op or "recv" in op


def collective_split(ranks: dict[int, dict]) -> dict[int, CollectiveTime]:
    """Each rank's :class:`CollectiveTime` (ranks without comm records are left out)."""
    comm = {r: d.get("comm") for r, d in ranks.items()}
    records = {r: recs for r, recs in comm.items() if recs is not None}
    if not records:
        return {}
    offset = {r: ranks[r].get("wall0", 0.0) - ranks[r].get("t0", 0.0) for r in records}
    n = len(ranks)
    # (op, group size) -> rank -> its blocking calls in order
    calls: dict[tuple[str, int], dict[int, list[list]]] = {}
    for r, recs in records.items():
        for rec in recs:
            if _blocking(rec) and not _point_to_point(str(rec[_OP])):
                calls.setdefault((rec[_OP], rec[_GSIZE]), {}).setdefault(r, []).append(rec)
    moving = dict.fromkeys(records, 0.0)
    waiting = dict.fromkeys(records, 0.0)
    matched: set[int] = set()  # id() of records split
    for (_op, gsize), per_rank in calls.items():
        counts = {len(per_rank.get(r, [])) for r in records}
        if gsize != n or len(records) != n or len(counts) != 1:
            continue
        for k in range(counts.pop()):
            starts = {r: per_rank[r][k][_START] + offset[r] for r in records}
            last = max(starts.values())
            for r in records:
                rec = per_rank[r][k]
                wait = min(max(last - starts[r], 0.0), rec[_DUR])
                waiting[r] += wait
                moving[r] += rec[_DUR] - wait
                matched.add(id(rec))
    out = {}
    for r, recs in records.items():
        unsplit = sum(_blocked(rec) for rec in recs if id(rec) not in matched)
        out[r] = CollectiveTime(len(recs), moving[r], waiting[r], unsplit)
    return out
