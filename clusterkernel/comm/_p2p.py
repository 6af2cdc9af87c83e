"""Point-to-point: tensors (zero copy) and Python objects (pickle protocol 5).

``dst``/``src`` are world ranks, as in ``torch.distributed``; ``src=None`` receives
from any rank and the call tells which one sent. Object messages use tags in a
range of their own, so a tensor receive never matches an object send.

Tensor sends and receives run from plans (:mod:`._plan`: the peer, the MPI datatype,
the entry's bytes) through :func:`~clusterkernel.comm._begin.enter`, unchecked as
point-to-point calls are. Object messages have nothing to keep (a pickle each call):
they take :func:`~clusterkernel.comm._begin.begin` with their peer, and every call
closes in the ledger (:func:`~clusterkernel.comm._handle.note`).
"""

from __future__ import annotations

from collections.abc import Generator
from functools import partial
from typing import Any

import torch
from mpi4py import MPI
from mpi4py.util import pkl5

from clusterkernel.comm import _plan, _torchpath
from clusterkernel.comm._begin import begin, enter
from clusterkernel.comm._dtypes import buf, dtype_of, unstage, wire
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Call, Work, _now, drive, note, run
from clusterkernel.comm._torchpath import route_for

_ANY = MPI.ANY_SOURCE
# Object messages live at tag + _OBJECT_TAGS; user tags must stay below it.
_TAG_UB = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
_OBJECT_TAGS = (_TAG_UB + 1) // 2
MAX_TAG = _OBJECT_TAGS - 1


def _tag(tag: object) -> int:
    if type(tag) is int and 0 <= tag <= MAX_TAG:
        return tag
    raise ValueError(f"tag must be an int in 0..{MAX_TAG}, got {tag!r}")


def _peer(g: Group, rank: object, what: str) -> int:
    peer = g.group_rank(rank, what)
    if peer == g.rank:
        raise ValueError(
            f"{what}={rank} is this rank itself; point-to-point needs another rank "
            "(a blocking send to oneself would deadlock)"
        )
    return peer


def send(
    tensor: torch.Tensor,
    dst: int,
    group: Group | None = None,
    tag: int = 0,
    async_op: bool = False,
) -> Work | None:
    """Send ``tensor`` to rank ``dst`` (blocking unless ``async_op=True``).

    Example::

        if comm.rank() == 0:
            comm.send(torch.ones(3), dst=1)
        elif comm.rank() == 1:
            comm.recv(t, src=0)        # t == [1.0, 1.0, 1.0]
    """
    g, c = member(group)
    peer = _peer(g, dst, "dst")
    tag = _tag(tag)
    route = route_for(g, tensor)
    if route is not None:
        call = begin(g, "send", tensor, alg=route[1], peer=peer)
        return _torchpath.send(g, tensor, dst, tag, route, async_op, call)
    key = ("send", *_plan.tensor_key(tensor), peer)
    plan = _plan.find(g, key) or _plan_p2p(g, key, "send", tensor, peer, _run_send)
    call = enter(g, plan)
    return plan.run(plan, g, c, tensor, tag, async_op, call)


def _plan_p2p(g: Group, key: tuple, name: str, tensor, peer: int, run) -> _plan.Plan:
    """Plan a new point-to-point signature (no check: ``sig`` None)."""
    info = dtype_of(tensor)
    world_peer = g.ranks[peer] if peer >= 0 else -1
    plan = _plan.Plan(
        g, name, run, info, size=tensor.nbytes, dtype=tensor.dtype, root=peer, peer=world_peer
    )
    return _plan.keep(g, key, plan)


def _run_send(plan, g: Group, c, tensor, tag: int, async_op: bool, call: Call) -> Work | None:
    w, info = wire(tensor)
    return run(call, c.Send, c.Isend, (buf(w, info), plan.root, tag), async_op=async_op, keep=w)


def isend(tensor: torch.Tensor, dst: int, group: Group | None = None, tag: int = 0) -> Work:
    """Nonblocking :func:`send`; returns a Work.

    Example::

        if comm.rank() == 0:
            w = comm.isend(t, dst=1)
            ...                        # compute while the tensor goes out
            w.wait()                   # then t may be written again
        elif comm.rank() == 1:
            comm.recv(t, src=0)
    """
    return send(tensor, dst, group, tag, async_op=True)


def recv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Group | None = None,
    tag: int = 0,
    async_op: bool = False,
) -> int | Work:
    """Receive into ``tensor`` from rank ``src`` (any rank if ``None``).

    Returns the sender's world rank; with ``async_op=True`` a Work whose
    ``result()`` is that rank. The message must have exactly the tensor's size.

    Example::

        t = torch.empty(3)
        if comm.rank() == 0:
            for _ in range(comm.size() - 1):
                sender = comm.recv(t)  # from whoever sends first; t holds its rank
        else:
            comm.send(torch.full((3,), float(comm.rank())), dst=0)
    """
    g, c = member(group)
    peer = _ANY if src is None else _peer(g, src, "src")
    tag = _tag(tag)
    # from any rank: MPI (NCCL cannot), so the sender's tensor must be on the host too
    route = route_for(g, tensor) if src is not None else None
    if route is not None:
        call = begin(g, "recv", tensor, alg=route[1], peer=peer)
        return _torchpath.recv(g, tensor, src, tag, route, async_op, call)
    key = ("recv", *_plan.tensor_key(tensor), peer)
    plan = _plan.find(g, key) or _plan_p2p(g, key, "recv", tensor, peer, _run_recv)
    call = enter(g, plan)
    return plan.run(plan, g, c, tensor, tag, async_op, call)


def _run_recv(plan, g: Group, c, tensor, tag: int, async_op: bool, call: Call) -> int | Work:
    w, info = wire(tensor, copy_in=False)
    nbytes = plan.size  # the bytes a matching message has
    peer = plan.root
    status = MPI.Status()
    if async_op:
        finish = partial(_received, g, tensor, w, status, nbytes)
        args = (buf(w, info), peer, tag)
        return run(
            call, None, c.Irecv, args, finish=finish, async_op=True, keep=w, statuses=[status]
        )
    t0 = _now()
    msg = c.Mprobe(peer, tag, status)
    got = status.Get_count(MPI.BYTE)
    if got != nbytes:
        msg.Recv([bytearray(got), MPI.BYTE])  # take it, so the sender is not left blocked
        raise ValueError(_size_error(g, status, got, tensor))
    msg.Recv(buf(w, info))
    unstage(tensor, w)
    note(call, t0, None)
    return g.ranks[status.Get_source()]


def irecv(
    tensor: torch.Tensor, src: int | None = None, group: Group | None = None, tag: int = 0
) -> Work:
    """Nonblocking :func:`recv`; ``work.result()`` is the sender's rank."""
    return recv(tensor, src, group, tag, async_op=True)


def _size_error(g: Group, status: MPI.Status, got: int, tensor: torch.Tensor) -> str:
    return (
        f"recv: the message from rank {g.ranks[status.Get_source()]} (tag {status.Get_tag()}) "
        f"has {got} bytes but the tensor ({tensor.dtype}{list(tensor.shape)}) holds "
        f"{tensor.nbytes}; receive into a tensor with the sender's shape and dtype"
    )


def _received(g: Group, tensor, w, status: MPI.Status, nbytes: int) -> int:
    got = status.Get_count(MPI.BYTE)
    if got != nbytes:
        raise ValueError(_size_error(g, status, got, tensor))
    unstage(tensor, w)
    return g.ranks[status.Get_source()]


def send_object(
    obj: Any, dst: int, group: Group | None = None, tag: int = 0, async_op: bool = False
) -> Work | None:
    """Send any picklable object to rank ``dst`` (pickle protocol 5: large numpy
    arrays and tensors inside go out of band, without an extra copy).

    Example::

        if comm.rank() == 0:
            comm.send_object({"step": 3, "lr": 0.1}, dst=1)
        elif comm.rank() == 1:
            cfg = comm.recv_object(src=0)   # {'step': 3, 'lr': 0.1}
    """
    g, c = member(group)
    peer = _peer(g, dst, "dst")
    steps = object_send_steps(pkl5.Intracomm(c), obj, [peer], _tag(tag) + _OBJECT_TAGS)
    return drive(begin(g, "send_object", record_alg="pkl5", peer=peer), steps, async_op)


def recv_object(
    src: int | None = None, group: Group | None = None, tag: int = 0, async_op: bool = False
) -> Any:
    """Receive an object sent with :func:`send_object` (from any rank if ``src`` is None).

    Returns the object; with ``async_op=True`` a Work whose ``result()`` is the object.
    An async object receive claims its message by probing, when it is made and
    then whenever it is polled (``wait()``/``is_completed()``): several outstanding
    ones with the same source and tag get the messages in the order they find them.

    Example::

        if comm.rank() == 0:
            comm.send_object({"step": 3, "lr": 0.1}, dst=1)
        elif comm.rank() == 1:
            cfg = comm.recv_object(src=0)   # {'step': 3, 'lr': 0.1}
    """
    g, c = member(group)
    peer = _ANY if src is None else _peer(g, src, "src")
    steps = object_recv_steps(pkl5.Intracomm(c), peer, _tag(tag) + _OBJECT_TAGS)
    call = begin(g, "recv_object", record_alg="pkl5", peer=peer)
    return drive(call, steps, async_op)


def object_send_steps(pkl: pkl5.Intracomm, obj: Any, peers: list[int], tag: int) -> Generator:
    """Steps sending ``obj`` to each of ``peers`` (group ranks of ``pkl``)."""
    reqs: list = []
    for p in peers:
        reqs.extend(pkl.isend(obj, p, tag))
    if reqs:
        yield reqs


def object_recv_steps(pkl: pkl5.Intracomm, peer: int, tag: int) -> Generator:
    """Steps receiving one object; the generator returns it."""
    while True:
        msg = pkl.improbe(peer, tag)
        if msg:
            break
        yield None  # nothing arrived yet: poll again
    req = msg.irecv()
    yield list(req)
    return req.wait()  # all parts are in: this only unpickles
