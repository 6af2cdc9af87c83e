"""Collectives on Python objects (pickle protocol 5 through ``mpi4py.util.pkl5``).

Objects are control data (configs, metrics, small state), not bulk tensors, so
these use plain point-to-point messages from or to the root on the group's private
communicator, each call with a tag of its own, which makes every one of them
available with ``async_op=True`` too. Cost grows linearly with the group size: use
tensor collectives for bulk data.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from mpi4py.util import pkl5

from clusterkernel.comm._begin import begin
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Work, drive
from clusterkernel.comm._p2p import object_recv_steps, object_send_steps


def _setup(name: str, group: Group | None, root: object = None, what: str = "src", count: int = -1):
    g, _ = member(group)
    groot = None if root is None else g.group_rank(root, what)
    call = begin(g, name, root=groot, record_alg="pkl5", count=count, detail="dtype")
    # The tag is drawn on every member in the same call order, so concurrent
    # object collectives never take each other's messages.
    return g, groot, pkl5.Intracomm(g.inner()), g.next_tag(), call


def _others(g: Group) -> list[int]:
    return [i for i in range(g.size) if i != g.rank]


def _bcast_steps(g: Group, root: int, pkl, tag: int, obj: Any) -> Generator:
    if g.rank == root:
        yield from object_send_steps(pkl, obj, _others(g), tag)
        return obj
    return (yield from object_recv_steps(pkl, root, tag))


def _gather_steps(g: Group, root: int, pkl, tag: int, obj: Any) -> Generator:
    if g.rank != root:
        yield from object_send_steps(pkl, obj, [root], tag)
        return None
    out = [None] * g.size
    out[root] = obj
    for i in _others(g):
        out[i] = yield from object_recv_steps(pkl, i, tag)
    return out


def broadcast_object(
    obj: Any = None, src: int = 0, group: Group | None = None, async_op: bool = False
) -> Any:
    """Return rank ``src``'s ``obj`` on every rank (others pass anything, e.g. None).

    Example::

        cfg = {"lr": 0.1, "epochs": 3} if comm.rank() == 0 else None
        cfg = comm.broadcast_object(cfg, src=0)   # rank 0's dict, on every rank
    """
    g, root, pkl, tag, call = _setup("broadcast_object", group, src)
    return drive(call, _bcast_steps(g, root, pkl, tag, obj), async_op)


def broadcast_object_list(
    object_list: list, src: int = 0, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Fill ``object_list`` on every rank with rank ``src``'s items, in place (as torch).

    Example::

        objs = [{"width": 64}, 3] if comm.rank() == 0 else [None, None]
        comm.broadcast_object_list(objs, src=0)   # objs == [{'width': 64}, 3] everywhere
    """
    _need_list(object_list, "object_list")
    g, root, pkl, tag, call = _setup("broadcast_object_list", group, src, count=len(object_list))

    def steps() -> Generator:
        got = yield from _bcast_steps(g, root, pkl, tag, list(object_list))
        object_list[:] = got

    return drive(call, steps(), async_op)


def gather_object(
    obj: Any,
    object_gather_list: list | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Rank ``dst`` receives every rank's ``obj`` into ``object_gather_list`` (group rank order).

    Example::

        out = [None] * comm.size() if comm.rank() == 0 else None
        comm.gather_object({"rank": comm.rank()}, out, dst=0)
    """
    g, _ = member(group)
    if g.rank == g.group_rank(dst, "dst"):
        _need_list(object_gather_list, "object_gather_list", g.size)
    elif object_gather_list:
        raise ValueError("object_gather_list must be given only on the dst rank; pass None here")
    g, root, pkl, tag, call = _setup("gather_object", group, dst, "dst")

    def steps() -> Generator:
        got = yield from _gather_steps(g, root, pkl, tag, obj)
        if got is not None:
            object_gather_list[:] = got

    return drive(call, steps(), async_op)


def all_gather_object(
    object_list: list, obj: Any, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Every rank receives every rank's ``obj`` into ``object_list`` (group rank order).

    Example::

        out = [None] * comm.size()
        comm.all_gather_object(out, socket.gethostname())
    """
    g, _ = member(group)
    _need_list(object_list, "object_list", g.size)
    g, _, pkl, tag, call = _setup("all_gather_object", group)

    def steps() -> Generator:
        got = yield from _gather_steps(g, 0, pkl, tag, obj)
        object_list[:] = yield from _bcast_steps(g, 0, pkl, tag, got)

    return drive(call, steps(), async_op)


def scatter_object_list(
    scatter_object_output_list: list,
    scatter_object_input_list: list | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Rank ``src`` sends ``scatter_object_input_list[i]`` to group rank ``i``, which
    stores it in ``scatter_object_output_list[0]`` (as torch).

    Example::

        out = [None]
        comm.scatter_object_list(out, [{"shard": i} for i in range(comm.size())] if comm.rank() == 0 else None)
    """
    g, _ = member(group)
    _need_list(scatter_object_output_list, "scatter_object_output_list")
    if not scatter_object_output_list:
        raise ValueError("scatter_object_output_list needs at least one slot, e.g. [None]")
    is_root = g.rank == g.group_rank(src, "src")
    if is_root:
        _need_list(scatter_object_input_list, "scatter_object_input_list", g.size)
    elif scatter_object_input_list:
        raise ValueError(
            "scatter_object_input_list must be given only on the src rank; pass None here"
        )
    g, root, pkl, tag, call = _setup("scatter_object_list", group, src)

    def steps() -> Generator:
        if is_root:
            reqs: list = []
            for i in _others(g):
                reqs.extend(pkl.isend(scatter_object_input_list[i], i, tag))
            if reqs:
                yield reqs
            scatter_object_output_list[0] = scatter_object_input_list[root]
        else:
            scatter_object_output_list[0] = yield from object_recv_steps(pkl, root, tag)

    return drive(call, steps(), async_op)


def _need_list(value: object, what: str, n: int | None = None) -> None:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise ValueError(f"{what} has {len(value)} items; it needs one per rank of the group ({n})")
