"""What is wrong on a cluster's ranks: their stacks, who died, what failed (client side).

The bodies of ``Cluster.frames``, ``stacks`` and ``dead_ranks``, which ranks were
lost between cells, and the failures of a ``pull``. They read the cluster and never
change it (what they find, the cluster records itself). Each rank's frames come from
its engine's control thread (works inside MPI calls and on any host), else from
``faulthandler`` for a rank on this machine whose control thread cannot answer; a job
that ended is read from the launcher's report.

Example::

    _rank_faults.stacks(cluster, [1, 3], code=cell)   # {1: "...", 3: "..."}
    _rank_faults.dead_ranks(cluster)                  # None, or ([2], report)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterkernel.client.cluster import _jobreport, _stacks
from clusterkernel.client.errors import RankFailure, group_failures
from clusterkernel.protocol._names import STACK_SIGNAL

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster


def frames(cluster: Cluster, ranks: list[int], with_locals: bool) -> dict[int, list[dict]]:
    """``{rank: frames}`` of the ranks that answered, outermost frame first."""
    engines = {r: cluster.engine_id(r) for r in ranks}
    out = _stacks.request_frames(cluster.client, engines, with_locals=with_locals)
    missing = [r for r in ranks if r not in out]
    if missing:
        out.update(
            _stacks.faulthandler_frames(
                cluster.run_dir or "",
                missing,
                lambda rs: cluster.signal(STACK_SIGNAL, rs),
            )
        )
    return out


def stacks(
    cluster: Cluster, ranks: list[int], code: str | None, with_locals: bool, all_frames: bool
) -> dict[int, str]:
    """``{rank: stack as text}`` for every rank in ``ranks``, a note for those that did not answer."""
    found = frames(cluster, ranks, with_locals)
    return {
        r: _stacks.format_stack(found[r], code, all_frames=all_frames, with_locals=with_locals)
        if r in found
        else "(no stack: the rank did not answer)"
        for r in ranks
    }


def dead_ranks(cluster: Cluster) -> tuple[list[int], str] | None:
    """If the MPI job has ended, ``(ranks that died first, the launcher's report)``."""
    if not cluster.job_ended():
        return None
    report = _jobreport.job_report(cluster.job_output(lines=200))
    return _jobreport.dead_ranks(report, cluster.n), report


def lost_engines(
    engine_of: dict[int, int], registered: list[int], dead: dict[int, str]
) -> list[int]:
    """Ranks not yet known dead whose engines are no longer registered (``engine_of``:
    rank -> engine id; ``registered``: the client's engine ids); the cluster records them."""
    ids = set(registered)
    return [r for r, eid in engine_of.items() if eid not in ids and r not in dead]


def pull_failures(cluster: Cluster, err) -> list[RankFailure]:
    """The failures of a pull, from ipyparallel's ``CompositeError``, grouped by rank."""
    items = []
    for ename, evalue, _tb, engine_info in err.elist:
        eid = (engine_info or {}).get("engine_id")
        try:
            rank = cluster.rank_of(eid)
        except KeyError:
            rank = -1
        # A failed pull is a missing or unpicklable name: the traceback would
        # only show ipyparallel's internals.
        items.append((rank, "error", f"{ename}: {evalue}", ""))
    return group_failures(items)


def push_failure(namespace: dict, err: Exception) -> Exception:
    """What a failed push says: the variables that cannot be pickled, by name and type."""
    import ipyparallel as ipp

    bad = []
    for name, value in namespace.items():
        try:
            ipp.serialize.serialize_object(value)
        except Exception as e:
            kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
            bad.append(f"{name} ({kind}): {e}")
    if not bad:
        return err
    return TypeError(
        f"cannot send to the ranks: {'; '.join(bad)}. Make such a value on the ranks in a "
        "%%mpi cell, or push the plain values it is made from."
    )
