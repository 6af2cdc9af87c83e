"""Gradient buckets and their asynchronous averaging (the engine under DataParallel).

Each bucket is averaged by a comm hook (:mod:`clusterkernel.train.comm_hooks`),
started as soon as its last gradient arrives during backward.

A plain object rather than an ``nn.Module``: its state changes on every gradient
hook, and ``nn.Module.__setattr__`` costs microseconds per assignment, which adds
up over models with many small layers.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.train._shared_buckets import shared_flats
from clusterkernel.train.comm_hooks import CommFuture, CommHook, GradBucket, allreduce_hook

_now = time.perf_counter


class Bucket:
    """Gradients of a few parameters laid out in one flat tensor.

    The parameters' ``.grad`` are views into ``flat``, so the allreduce result
    needs no copy back. After the gradients come one "used" flag per parameter:
    averaged with the rest, a flag of zero means no rank touched that parameter.
    """

    __slots__ = (
        "params",
        "numel",
        "flat",
        "views",
        "used",
        "scratch",
        "fired",
        "pending",
        "future",
    )

    def __init__(self, params: list[nn.Parameter], flat: torch.Tensor | None = None):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        if flat is None:
            # on the parameters' device: a CUDA model's buckets go through NCCL
            # (comm's torch path), not through host copies
            p0 = params[0]
            flat = torch.zeros(self.numel + len(params), dtype=p0.dtype, device=p0.device)
        self.flat = flat  # zeros (in the group's shared memory when given)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.used = self.flat[self.numel :]
        self.scratch: dict = {}  # the comm hook's working tensors (GradBucket.scratch)
        self.reset()

    def reset(self) -> None:
        """Ready for the next step: no gradient arrived, nothing on the wire."""
        self.fired = [False] * len(self.params)
        self.pending = len(self.params)
        self.future: CommFuture | None = None


def plan_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Parameters per bucket, in reverse parameter order (the order backward
    produces gradients)."""
    groups, cur, cur_bytes = [], [], 0
    for p in reversed(params):
        if cur and (p.dtype != cur[0].dtype or cur_bytes >= bucket_bytes):
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(p)
        cur_bytes += p.numel() * p.element_size()
    if cur:
        groups.append(cur)
    return groups


def make_buckets(
    params: list[nn.Parameter],
    bucket_bytes: int,
    group: comm.Group | None = None,
    shared: bool | None = False,
    owner: object = None,
) -> tuple[list[Bucket], bool]:
    """The buckets, and whether their flat tensors are in ``group``'s shared memory
    (as ``shared`` asks: see :func:`~._shared_buckets.shared_flats`; collective
    unless False)."""
    groups = plan_buckets(params, bucket_bytes)
    layout = [(sum(p.numel() for p in ps) + len(ps), ps[0].dtype) for ps in groups]
    flats = shared_flats(layout, params, group, shared, owner)
    if flats is None:
        return [Bucket(ps) for ps in groups], False
    return [Bucket(ps, f) for ps, f in zip(groups, flats, strict=True)], True


class GradReducer:
    """Average gradients over a group bucket by bucket, started from grad hooks.

    ``hook(state, bucket)`` averages one bucket (default: :func:`allreduce_hook`).
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        bucket_bytes: int,
        group: comm.Group | None,
        shared: bool | None = False,
    ):
        self.group = group
        self.hook: CommHook = allreduce_hook
        self.state: Any = None
        self.buckets, self.shared = make_buckets(params, bucket_bytes, group, shared, self)
        self.next = 0  # index of the next bucket to launch, to keep launch order
        self.enabled = True  # False inside no_sync()
        self.dirty = False  # a training forward or backward ran since the last sync
        self.comm_seconds = 0.0  # launches and waits so far in the current step
        self.last_comm_seconds = 0.0
        self.total_comm_seconds = 0.0
        self.hooks = [
            p.register_post_accumulate_grad_hook(self._make_hook(b, i))
            for b in self.buckets
            for i, p in enumerate(b.params)
        ]

    def remove(self) -> None:
        """Detach the gradient hooks from the parameters."""
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def _make_hook(self, bucket: Bucket, i: int):
        view = bucket.views[i]

        def hook(p: torch.Tensor) -> None:
            if not self.enabled:
                return
            if p.grad is not view:
                # First backward after zero_grad(set_to_none=True): autograd made a
                # fresh tensor. Move it into the bucket and point .grad at the slot.
                view.copy_(p.grad)
                p.grad = view
            if bucket.fired[i]:
                raise RuntimeError(
                    "DataParallel: a parameter received a second gradient in one step "
                    "while its allreduce was already running. Wrap all but the last "
                    "backward() of a step in `with model.no_sync():`."
                )
            self.dirty = True
            bucket.fired[i] = True
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready()

        return hook

    def _launch_ready(self) -> None:
        # Launch strictly in bucket order, so every rank issues the same
        # collectives in the same order even if gradients arrive differently.
        buckets = self.buckets
        while self.next < len(buckets) and buckets[self.next].pending == 0:
            self._launch(buckets[self.next])
            self.next += 1

    def _launch(self, b: Bucket) -> None:
        t0 = _now()
        if all(b.fired):
            b.used.fill_(1.0)
        else:
            for j, fired in enumerate(b.fired):
                b.used[j] = 1.0 if fired else 0.0
                if not fired:
                    b.views[j].zero_()
        last = b is self.buckets[-1]
        bucket = GradBucket(self.next, b.flat, b.params, last, self.group, b.scratch)
        b.future = self.hook(self.state, bucket)
        self.comm_seconds += _now() - t0

    def synchronize(self) -> bool:
        """Launch what is left, wait for everything; False if there was nothing to do."""
        if not self.dirty:
            return False
        t0 = _now()
        for b in self.buckets[self.next :]:
            b.pending = 0
        self._launch_ready()
        for b in self.buckets:
            average = b.future.wait()
            if average is not b.flat:
                if not isinstance(average, torch.Tensor) or average.numel() != b.flat.numel():
                    raise RuntimeError(
                        f"DataParallel: comm hook {getattr(self.hook, '__name__', self.hook)} "
                        f"gave {type(average).__name__} for a bucket of {b.flat.numel()} "
                        "values; its future's value must be the bucket's average, a tensor "
                        "of the same size."
                    )
                b.flat.copy_(average.view_as(b.flat))
            if not bool(b.used.all()):
                # some rank skipped some parameter: None where no rank used it
                for p, view, u in zip(b.params, b.views, b.used.tolist()):
                    p.grad = view if u > 0 else None
            elif not all(b.fired):
                for p, view in zip(b.params, b.views):
                    if p.grad is not view:
                        p.grad = view
            b.reset()
        self.next = 0
        self.dirty = False
        self.comm_seconds += _now() - t0  # plus launch time from this step's hooks
        self.total_comm_seconds += self.comm_seconds
        self.last_comm_seconds = self.comm_seconds
        self.comm_seconds = 0.0
        return True

    @property
    def launched(self) -> bool:
        """Some bucket of the current step is already on the wire."""
        return self.dirty and self.next > 0
