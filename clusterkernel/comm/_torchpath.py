"""Device tensors through torch.distributed: NCCL for CUDA tensors, where the ranks have it.

MPI from PyPI is not CUDA-aware, so MPI would move a CUDA tensor through a host copy
each way. When the ranks have a torch.distributed default group (``%mpi start
--torch``, or the user's own ``init_process_group``) with a backend for the
tensor's device, ``comm`` hands the call to that backend instead: NCCL on GPU
nodes. CPU tensors keep MPI. The call is still ``comm``'s: it is checked against
the other ranks (the check includes the transport, so ranks that would use
different ones get an error, not a hang), it has a flight-recorder entry, and it
writes a timing record whose algorithm is the backend's name.

Which device types go this way is :func:`route_to_torch`'s setting (``cuda`` by
default). Routing CPU tensors through gloo exists for comparisons (and is how the
path is tested on machines without GPUs).

Example::

    comm.route_to_torch("cuda")        # the default: CUDA tensors through NCCL
    t = torch.ones(4, device="cuda")
    comm.all_reduce(t)                 # NCCL, when the ranks have a group with it
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from clusterkernel.comm import _fastpath
from clusterkernel.comm._groups import WORLD, Group
from clusterkernel.comm._handle import Call, Work, _now, note
from clusterkernel.comm._ops import AVG, ReduceOp


class _Route:
    __slots__ = ("devices", "cpu")

    def __init__(self) -> None:
        self.devices: frozenset[str] = frozenset({"cuda"})
        self.cpu = False  # "cpu" in devices, read on the hot path


ROUTE = _Route()


class _Known:
    """What was learnt of one default group: its backends per device type and the
    subgroups made on it for comm's groups. A new default group (``torch-reinit``,
    a user's own ``init_process_group`` after ``destroy_process_group``) starts anew."""

    __slots__ = ("default", "backends", "subgroups")

    def __init__(self, default: Any = None, backends: dict[str, str] | None = None) -> None:
        self.default = default  # held: no later group can reuse its id
        self.backends = backends or {}
        self.subgroups: dict[tuple[int, ...], Any] = {}


_KNOWN = _Known()


def route_to_torch(*device_types: str) -> tuple[str, ...]:
    """Send tensors of these device types through torch.distributed; return the old setting.

    The default is ``("cuda",)``: CUDA tensors go through the default group's backend
    (NCCL on GPU nodes) when the ranks have one, everything else through MPI.
    ``route_to_torch()`` sends everything through MPI; ``route_to_torch("cuda", "cpu")``
    sends CPU tensors through gloo too (to compare the two on the same calls). Call
    it on every rank alike: ranks that pick different transports for one call get a
    :class:`CollectiveMismatchError`.

    Example::

        old = comm.route_to_torch("cuda", "cpu")
        comm.all_reduce(torch.ones(4))       # through gloo
        comm.route_to_torch(*old)
    """
    for d in device_types:
        if not isinstance(d, str) or not d:
            raise ValueError(f"route_to_torch takes device type names such as 'cuda', got {d!r}")
    old = tuple(sorted(ROUTE.devices))
    ROUTE.devices = frozenset(device_types)
    ROUTE.cpu = "cpu" in ROUTE.devices
    if _fastpath.available():  # the C path serves CPU tensors by MPI only
        _fastpath.enable(not ROUTE.cpu)
    return old


def route_for(g: Group, tensor: object) -> tuple[Any, str] | None:
    """:func:`torch_group` for any argument: None for CPU tensors (unless routed) and
    for what is not a tensor (MPI's path gives the clear error)."""
    if not isinstance(tensor, torch.Tensor) or (tensor.is_cpu and not ROUTE.cpu):
        return None
    return torch_group(g, tensor)


def torch_group(g: Group, tensor: torch.Tensor) -> tuple[Any, str] | None:
    """The torch.distributed group to move ``tensor`` on for ``g`` and its backend's
    name ("nccl", "gloo"), or None: MPI moves it.

    Only a process that already imported torch.distributed can have a group: no
    import here.
    """
    device = tensor.device.type
    if device not in ROUTE.devices:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return None
    known = _KNOWN
    if dist.group.WORLD is not known.default:
        known = _learn(dist)
    name = known.backends.get(device)
    if name is None:
        return None  # the group has no backend for this device: MPI stages it
    if g is WORLD or g.size == dist.get_world_size():
        return known.default, name
    pg = known.subgroups.get(g.ranks)
    if pg is None:
        # only the members get here (comm's groups are made by all, used by members):
        # torch's local synchronization lets the members make it among themselves
        pg = dist.new_group(list(g.ranks), use_local_synchronization=True)
        known.subgroups[g.ranks] = pg
    return pg, name


def _learn(dist: Any) -> _Known:
    """Learn the default group's backend per device type from its public config:
    "cpu:gloo,cuda:nccl" (``get_backend()`` reads "undefined" for torch's pick by
    device, the pick of ``init_process_group()`` without a backend)."""
    from clusterkernel.torchdist._group import device_backends

    global _KNOWN
    default = dist.group.WORLD
    backends = device_backends(dist, default)
    _KNOWN = _Known(default, backends)
    return _KNOWN


class _TorchWork(Work):
    """A :class:`Work` around torch.distributed's own work object."""

    __slots__ = ()

    def _step(self, block: bool) -> bool:
        if self._done:
            return True
        tw = self._reqs[0]
        try:
            if not block and not tw.is_completed():
                return False
            tw.wait()  # raises the backend's error; for NCCL, orders the current stream
            if self._finish is not None:
                self._result = self._finish()
        except BaseException as exc:
            self._error = exc
        self._complete()
        return True


def _op(op: ReduceOp):
    import torch.distributed as dist

    # AVG as SUM and a division, as on the MPI path (and as gloo needs)
    return dist.ReduceOp.SUM if op is AVG else getattr(dist.ReduceOp, op.name)


def run(call: Call, fn: Callable, args: tuple, pg: Any, async_op: bool, finish=None, **kw):
    """``fn(*args, group=pg, **kw)``, one torch.distributed call, timed as ``call``."""
    t0 = _now()
    tw = fn(*args, group=pg, async_op=async_op, **kw)
    if async_op:
        return _TorchWork([tw], call, t0, finish)
    result = finish() if finish is not None else None
    note(call, t0, None)
    return result


def _newest(dist: Any, name: str, old_name: str) -> Callable:
    """torch's current name for a call (2.13 renamed the ``*_tensor`` collectives to
    ``*_single`` and warns on the old names), or the old one on older torch."""
    return getattr(dist, name, None) or getattr(dist, old_name)


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _finish(tensor: torch.Tensor, w: torch.Tensor, divisor: int) -> None:
    if divisor != 1:
        w.div_(divisor)
    if w is not tensor:
        tensor.copy_(w)


def _finisher(tensor: torch.Tensor, w: torch.Tensor, divisor: int = 1):
    return None if (w is tensor and divisor == 1) else partial(_finish, tensor, w, divisor)


def all_reduce(g: Group, tensor, op: ReduceOp, route, async_op: bool, call: Call) -> Work | None:
    import torch.distributed as dist

    pg = route[0]
    w = _dense(tensor)
    finish = _finisher(tensor, w, g.size if op is AVG else 1)
    return run(call, dist.all_reduce, (w,), pg, async_op, finish, op=_op(op))


def broadcast(g: Group, tensor, src: int, route, async_op: bool, call: Call) -> Work | None:
    import torch.distributed as dist

    pg = route[0]
    w = _dense(tensor)
    return run(call, dist.broadcast, (w, src), pg, async_op, _finisher(tensor, w))


def reduce(g: Group, tensor, dst: int, op: ReduceOp, route, async_op: bool, call: Call):
    import torch.distributed as dist

    pg = route[0]
    mine = g.ranks[g.rank] == dst
    # a copy on the other ranks: comm promises their tensors unchanged, and a
    # backend may use the input of a non-root rank as scratch space
    w = _dense(tensor) if mine else tensor.clone(memory_format=torch.contiguous_format)
    finish = _finisher(tensor, w, g.size if op is AVG else 1) if mine else None
    return run(call, dist.reduce, (w, dst), pg, async_op, finish, op=_op(op))


def all_gather_into_tensor(g: Group, output, input, route, async_op: bool, call: Call):
    import torch.distributed as dist

    pg = route[0]
    w = _dense(output)
    # flat views: comm takes any output shape of the right size, torch's backends
    # compare each rank's chunk of the output with the input's shape
    fn = _newest(dist, "all_gather_single", "all_gather_into_tensor")
    args = (w.view(-1), _dense(input).view(-1))
    return run(call, fn, args, pg, async_op, _finisher(output, w))


def reduce_scatter_tensor(g: Group, output, input, op: ReduceOp, route, async_op: bool, call: Call):
    import torch.distributed as dist

    pg = route[0]
    w = _dense(output)
    finish = _finisher(output, w, g.size if op is AVG else 1)
    fn = _newest(dist, "reduce_scatter_single", "reduce_scatter_tensor")
    args = (w.view(-1), _dense(input).view(-1))
    return run(call, fn, args, pg, async_op, finish, op=_op(op))


def send(g: Group, tensor, dst: int, tag: int, route, async_op: bool, call: Call) -> Work | None:
    import torch.distributed as dist

    pg = route[0]
    t0 = _now()
    if async_op:
        return _TorchWork([dist.isend(_dense(tensor), dst, group=pg, tag=tag)], call, t0)
    dist.send(_dense(tensor), dst, group=pg, tag=tag)
    note(call, t0, None)
    return None


def recv(g: Group, tensor, src: int, tag: int, route, async_op: bool, call: Call):
    """Receive from ``src`` (a world rank); returns it, as comm's own recv does."""
    import torch.distributed as dist

    pg = route[0]
    w = _dense(tensor)
    finish = _finisher(tensor, w)
    t0 = _now()
    if async_op:
        done = partial(_received, finish, src)
        return _TorchWork([dist.irecv(w, src, group=pg, tag=tag)], call, t0, done)
    dist.recv(w, src, group=pg, tag=tag)
    _received(finish, src)
    note(call, t0, None)
    return src


def _received(finish, src: int) -> int:
    if finish is not None:
        finish()
    return src
