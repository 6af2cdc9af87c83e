"""Tensor fusion: allreduce many small tensors as a few large buckets.

Many small allreduces cost one network latency each; packing them into buckets of
``bucket_bytes`` pays it once per bucket. Packing and unpacking are one
``torch._foreach_copy_`` each (a single C++ loop) over views into the bucket, and
the views and buffers are cached per layout (shapes and dtypes), so a training loop
that reduces the same gradients every step does no Python work per tensor beyond
reading its shape.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache

import torch
from mpi4py import MPI

from clusterkernel.comm import _auto, _check, _hugepages, _ring, _shm
from clusterkernel.comm._auto.adapt import launched, settle
from clusterkernel.comm._begin import begin
from clusterkernel.comm._dtypes import DTYPES, as_numpy, buf, dtype_of, reduced, reduced_torch
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Work, _now, drive, note
from clusterkernel.comm._ops import (
    AVG,
    FUSED_ALGORITHMS,
    SUM,
    ReduceOp,
    check_algorithm,
    op_for,
    parse_op,
)

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # as torch DDP
_CACHE_SIZE = 16
_IN_PLACE = MPI.IN_PLACE

if hasattr(torch, "_foreach_copy_"):
    _copy_all = torch._foreach_copy_
else:  # pragma: no cover - torch < 2.1

    def _copy_all(dst: list, src: list) -> None:
        for d, s in zip(dst, src):
            d.copy_(s)


class _Bucket:
    """One flat buffer and, per member tensor, a view of it with that tensor's shape."""

    __slots__ = ("index", "flat", "views", "info", "busy", "nbytes")

    def __init__(self, index: list[int], shapes: list, wire_dtype: torch.dtype, info, nbytes):
        numels = [_numel(s) for s in shapes]
        self.index = index
        self.nbytes = nbytes  # of the user's tensors (halves count 2 bytes)
        # Huge-page backed when large (see _hugepages); reused while the layout is.
        self.flat = torch.from_numpy(_hugepages.empty(sum(numels), DTYPES[wire_dtype].np))
        self.views = [v.view(s) for v, s in zip(self.flat.split(numels), shapes)]
        self.info = info
        self.busy = False


def _numel(shape: torch.Size) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _plan(key: tuple, bucket_bytes: int) -> list[_Bucket]:
    """Cut the tensors (described by ``key``) into same-dtype buckets, in order."""
    buckets: list[_Bucket] = []
    index: list[int] = []
    shapes: list = []
    size = 0
    dtype = None

    def close() -> None:
        if index:
            info = DTYPES[dtype]
            winfo = reduced(info)
            wire_dtype = reduced_torch(dtype)
            buckets.append(_Bucket(index, shapes, wire_dtype, winfo, size))

    for i, (shape, tdtype) in enumerate(key):
        nbytes = _numel(shape) * DTYPES[tdtype].itemsize
        if index and (tdtype != dtype or size + nbytes > bucket_bytes):
            close()
            index, shapes, size = [], [], 0
        dtype = tdtype
        index.append(i)
        shapes.append(shape)
        size += nbytes
    close()
    return buckets


_PLANS: OrderedDict[tuple, list[_Bucket]] = OrderedDict()


def _buckets_for(key: tuple, bucket_bytes: int, tensors, op: ReduceOp) -> list[_Bucket]:
    cache_key = (bucket_bytes, op, key)
    plan = _PLANS.get(cache_key)
    if plan is None:
        # First sight of this layout: validate every dtype against the op once.
        for i, (_, dtype) in enumerate(key):
            if dtype not in DTYPES:
                dtype_of(tensors[i], f"tensors[{i}]")  # raises
            op_for(op, DTYPES[dtype].kind, dtype)
    if plan is None or any(b.busy for b in plan):
        # A busy plan belongs to an outstanding async call: never share its buffers.
        plan = _plan(key, bucket_bytes)
        if cache_key not in _PLANS:
            _PLANS[cache_key] = plan
            if len(_PLANS) > _CACHE_SIZE:
                _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(cache_key)
    return plan


@lru_cache(maxsize=_CACHE_SIZE)
def _layout_code(key: tuple) -> int:
    """The check's code for a list's shapes and dtypes (cached: a model's gradients
    keep one layout, and the code is a hash of its text)."""
    return _check.layout_code(key)


def all_reduce_coalesced(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    algorithm: str = "auto",
) -> Work | None:
    """Allreduce a list of tensors in place, packed into buckets of ``bucket_bytes``.

    One allreduce per bucket instead of one per tensor; tensors may differ in shape
    and dtype (each bucket holds one dtype). ``algorithm`` as in :func:`all_reduce`
    (``"auto"`` chooses by the largest bucket's size).

    Example::

        grads = [p.grad for p in model.parameters()]
        comm.all_reduce_coalesced(grads, op=comm.AVG, bucket_bytes=1 << 20)
    """
    g, c = member(group)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}")
    try:
        key = tuple([(t.shape, t.dtype) for t in tensors])
    except AttributeError:
        for i, t in enumerate(tensors):
            dtype_of(t, f"tensors[{i}]")
        raise
    op = parse_op(op)
    if algorithm != "auto":
        check_algorithm(algorithm, FUSED_ALGORITHMS, "all_reduce_coalesced")
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
    buckets = _buckets_for(key, bucket_bytes, tensors, op)
    nbytes = sum(b.nbytes for b in buckets)
    arm, why = None, ""
    if algorithm == "auto":
        biggest = max((b.nbytes for b in buckets), default=0)
        algorithm = _auto.pick(g, "all_reduce_coalesced", tensors[0], biggest) if tensors else "mpi"
        if tensors and tensors[0].is_cpu:  # device tensors: MPI (pick), nothing to adapt
            arm = _auto.adaptive(g, "all_reduce_coalesced", biggest)
        if arm is not None:  # the group's arm: the same algorithm on every member
            algorithm = arm.current if async_op else arm.next()
            why = arm.why_for(algorithm)  # the records say "ring (probe)", "shm (switch)"
    if arm is None:
        return _run_buckets(g, c, tensors, buckets, key, nbytes, op, algorithm, async_op, why)
    if async_op:
        work = _run_buckets(g, c, tensors, buckets, key, nbytes, op, algorithm, True, why)
        launched(g, work)
        return work
    t0 = _now()
    _run_buckets(g, c, tensors, buckets, key, nbytes, op, algorithm, False, why)
    settle(g)
    arm.took(g, algorithm, _now() - t0)
    return None


def _run_buckets(
    g: Group, c: MPI.Intracomm, tensors: Sequence[torch.Tensor], buckets: list[_Bucket],
    key: tuple, nbytes: int, op: ReduceOp, algorithm: str, async_op: bool, why: str = "",
) -> Work | None:  # fmt: skip
    call = begin(
        g,
        "all_reduce_coalesced",
        tensors[0] if tensors else None,
        nbytes=nbytes,
        op=op,
        alg=algorithm,
        record_alg=f"{algorithm} ({why})" if why else None,
        count=len(tensors),
        extra=_layout_code(key),
    )
    for b in buckets:
        _copy_all(b.views, [tensors[i] for i in b.index] if len(buckets) > 1 else list(tensors))
        b.busy = True
    if algorithm == "shm":  # shm divides for AVG itself
        then = _Unpack(buckets, tensors, 1)
        return _shm.all_reduce_flats(g, call, [b.flat for b in buckets], op, async_op, then)
    if algorithm == "ring":  # the ring divides for AVG itself
        steps = _ring_buckets(g, buckets, op, _Unpack(buckets, tensors, 1))
        return drive(call, steps, async_op)
    finish = _Unpack(buckets, tensors, g.size if op is AVG else 1)
    specs = [(buf(b.flat, b.info), op_for(op, b.info.kind, b.flat.dtype)) for b in buckets]
    t0 = _now()
    if async_op:
        reqs = [c.Iallreduce(_IN_PLACE, spec, mop) for spec, mop in specs]
        return Work(reqs, call, t0, finish, keep=buckets)
    for spec, mop in specs:
        c.Allreduce(_IN_PLACE, spec, mop)
    finish()
    note(call, t0, None)
    return None


class _Unpack:
    """Finishing step: divide for AVG, copy bucket views back, free the buffers."""

    __slots__ = ("buckets", "tensors", "divisor")

    def __init__(self, buckets: list[_Bucket], tensors, divisor: int):
        self.buckets = buckets
        self.tensors = tensors
        self.divisor = divisor

    def __call__(self) -> None:
        tensors = self.tensors
        with torch.no_grad():
            for b in self.buckets:
                if self.divisor != 1:
                    b.flat.div_(self.divisor)
                targets = [tensors[i] for i in b.index] if len(self.buckets) > 1 else list(tensors)
                _copy_all(targets, b.views)
                b.busy = False


def _ring_buckets(g: Group, buckets: list[_Bucket], op: ReduceOp, finish: _Unpack):
    for b in buckets:
        yield from _ring.ring_steps(g, as_numpy(b.flat, b.info), b.info, op)
    finish()
