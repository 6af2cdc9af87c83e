"""The ranks' variables: ``Cluster.push`` and ``Cluster.pull`` (client side).

Values travel pickled through ipyparallel, as ``%px`` push/pull do; what cannot be
sent or read is said by name (a value that does not pickle, a name a rank lacks).

Example::

    cluster.push({"lr": 0.1})     # push(cluster, {"lr": 0.1})
    cluster.pull("lr")            # {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from clusterkernel.client.errors import RankError, RankFailure, group_failures

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster


def push(cluster: Cluster, namespace: dict, ranks: list[int] | None = None) -> None:
    """Copy ``namespace`` into every rank's globals (pickled, like ``%px`` push).

    A value that cannot be pickled is a ``TypeError`` naming it, before anything is sent.
    """
    view = cluster.view(ranks)
    try:
        view.push(namespace, block=True)
    except Exception as e:
        raise push_failure(namespace, e) from None


def pull(cluster: Cluster, name: str, ranks: list[int] | None = None) -> dict[int, Any]:
    """``{rank: value}`` of the global ``name`` on each (live) rank."""
    ranks = cluster.live_ranks if ranks is None else list(ranks)
    try:
        values = cluster.view(ranks).pull(name, block=True)
    except ipp.error.CompositeError as e:
        raise RankError(pull_failures(cluster, e)) from None
    return dict(zip(ranks, values))


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
