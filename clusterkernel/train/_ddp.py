"""Synchronous data parallelism: bucketed gradient allreduce overlapped with backward."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.train._sync import broadcast_tensors, check_replicas, world_rank

_COMPRESSION = (None, "fp16")
_BUFFERS = ("average", "broadcast", "none")


class _Bucket:
    """Gradients of a few parameters laid out in one flat tensor.

    The parameters' ``.grad`` are views into ``flat``, so the allreduce result
    needs no copy back. After the gradients come one "used" flag per parameter:
    averaged with the rest, a flag of zero means no rank touched that parameter.
    """

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel + len(params), dtype=params[0].dtype)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.used = self.flat[self.numel :]
        self.wire: torch.Tensor | None = None  # fp16 compression buffers
        self.inbox: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.fired = [False] * len(self.params)
        self.pending = len(self.params)
        self.handle = None


class DataParallel(nn.Module):
    """Wrap a model for synchronous data-parallel training over all ranks.

    At wrap time it checks that every rank built the same model (and optimizer),
    then copies rank 0's parameters and buffers to all ranks. During ``backward()``
    each parameter's gradient lands in a bucket (buckets fill in reverse parameter
    order, the order backward produces them); as soon as a bucket is full its
    averaging allreduce starts asynchronously, so communication overlaps the rest
    of backward. :meth:`synchronize` waits for all buckets; it runs by itself
    before ``optimizer.step()`` when the optimizer is passed in, otherwise call it
    yourself. After every step all ranks hold bit-identical parameters.

    Example::

        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        model = DataParallel(net, optimizer=opt)
        for x, y in loader:                  # this rank's shard
            opt.zero_grad()
            loss_fn(model(x), y).backward()  # allreduce runs during backward
            opt.step()                       # waits for the averaged gradients first

    Args:
        module: the model; its parameters stay its own (no copies).
        optimizer: if given, :meth:`synchronize` runs as a step pre-hook, and its
            parameter groups are checked across ranks at wrap time.
        bucket_bytes: target bucket size. Smaller buckets start earlier (more
            overlap), larger ones cost fewer messages.
        compression: ``None`` or ``"fp16"``: gradients travel as float16, half
            the bytes, and are summed in float32 (an all-to-all of fp16 chunks,
            a local sum, an all-gather). Costs gradient precision (~1e-3
            relative); pays off when the network, not compute, is the limit.
        buffers: ``"average"`` (default) averages floating buffers such as
            BatchNorm running statistics at every synchronize, ``"broadcast"``
            copies rank 0's, ``"none"`` leaves them per rank.
        group: a communicator group from ``comm.new_group`` (default: all ranks).

    Unused parameters are handled: a rank whose forward skipped a parameter
    contributes zeros for it, so all ranks issue the same allreduces in the same
    order. A parameter that no rank used keeps ``grad=None``, as in one process.
    Every rank must run forward and backward each step.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        bucket_bytes: int = 1 << 20,
        compression: str | None = None,
        buffers: str = "average",
        group=None,
    ):
        super().__init__()
        if compression not in _COMPRESSION:
            raise ValueError(f"compression must be one of {_COMPRESSION}, got {compression!r}.")
        if buffers not in _BUFFERS:
            raise ValueError(f"buffers must be one of {_BUFFERS}, got {buffers!r}.")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}.")
        self.module = module
        self.group = group
        self.compression = compression
        self.buffer_mode = buffers
        self.world = comm.size(group)

        check_replicas(module, optimizer, group)
        self._root = world_rank(group, 0)
        broadcast_tensors([*module.parameters(), *module.buffers()], self._root, group)

        self._buckets = self._make_buckets(bucket_bytes)
        self._hooks = []
        for b in self._buckets:
            for i, p in enumerate(b.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(b, i)))
        self._step_hook = None
        if optimizer is not None:
            self._step_hook = optimizer.register_step_pre_hook(lambda *_: self.synchronize())
        self._next = 0  # index of the next bucket to launch, to keep launch order
        self._sync_enabled = True
        self._dirty = False  # a training forward or backward ran since the last sync
        self.comm_seconds = 0.0  # launches and waits so far in the current step
        self.last_comm_seconds = 0.0  # the same for the last finished step
        self.total_comm_seconds = 0.0

    # -- construction ----------------------------------------------------------
    def _make_buckets(self, bucket_bytes: int) -> list[_Bucket]:
        seen: set[int] = set()
        params = []
        for p in self.module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        buckets, cur, cur_bytes = [], [], 0
        for p in reversed(params):
            if cur and (p.dtype != cur[0].dtype or cur_bytes >= bucket_bytes):
                buckets.append(_Bucket(cur))
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += p.numel() * p.element_size()
        if cur:
            buckets.append(_Bucket(cur))
        return buckets

    def _make_hook(self, bucket: _Bucket, i: int):
        view = bucket.views[i]

        def hook(p: torch.Tensor) -> None:
            if not self._sync_enabled:
                return
            g = p.grad
            if g is not view:
                # First backward after zero_grad(set_to_none=True): autograd made a
                # fresh tensor. Move it into the bucket and point .grad at the slot.
                view.copy_(g)
                p.grad = view
            if bucket.fired[i]:
                raise RuntimeError(
                    "DataParallel: a parameter received a second gradient in one step "
                    "while its allreduce was already running. Wrap all but the last "
                    "backward() of a step in `with model.no_sync():`."
                )
            self._dirty = True
            bucket.fired[i] = True
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready()

        return hook

    # -- communication ---------------------------------------------------------
    def _launch_ready(self) -> None:
        # Launch strictly in bucket order, so every rank issues the same
        # collectives in the same order even if gradients arrive differently.
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch(self._buckets[self._next])
            self._next += 1

    def _launch(self, b: _Bucket) -> None:
        t0 = time.perf_counter()
        if all(b.fired):
            b.used.fill_(1.0)
        else:
            for j, fired in enumerate(b.fired):
                b.used[j] = 1.0 if fired else 0.0
                if not fired:
                    b.views[j].zero_()
        if self.compression == "fp16":
            self._launch_fp16(b)
        else:
            b.handle = comm.all_reduce(b.flat, op=comm.AVG, async_op=True, group=self.group)
        self.comm_seconds += time.perf_counter() - t0

    def _launch_fp16(self, b: _Bucket) -> None:
        # MPI has no half-precision sum, and a reduction through float32 would
        # send float32. So: an all-to-all of fp16 chunks (each rank receives
        # every rank's copy of its own chunk), a local float32 sum, and an
        # all-gather of the summed fp16 chunks. Halves on the wire both ways.
        n = self.world
        if b.wire is None:
            padded = -(-b.flat.numel() // n) * n
            b.wire = torch.zeros(padded, dtype=torch.float16)
            b.inbox = torch.empty(padded, dtype=torch.float16)
        # scale first: the average, not the sum, must fit fp16's range
        b.wire[: b.flat.numel()].copy_(b.flat.mul_(1.0 / n))
        b.handle = comm.all_to_all_single(b.inbox, b.wire, group=self.group, async_op=True)

    def _finish_fp16(self, b: _Bucket):
        b.handle.wait()
        mine = b.inbox.view(self.world, -1).float().sum(0).to(torch.float16)
        return comm.all_gather_into_tensor(b.wire, mine, group=self.group, async_op=True)

    def synchronize(self) -> None:
        """Finish the gradient averaging of this step (and the buffer sync).

        Launches buckets whose parameters got no gradient on this rank (with
        zeros), waits for all allreduces, and leaves the averaged gradients in
        ``p.grad``. Calling it again before the next forward does nothing.
        """
        if not self._dirty:
            return
        t0 = time.perf_counter()
        for b in self._buckets[self._next :]:
            b.pending = 0
        self._launch_ready()
        if self.compression == "fp16":
            gathers = [self._finish_fp16(b) for b in self._buckets]
            for b, g in zip(self._buckets, gathers):
                g.wait()
                b.flat.copy_(b.wire[: b.flat.numel()])
        for b in self._buckets:
            b.handle.wait()
            if not bool(b.used.all()):
                for p, view, u in zip(b.params, b.views, b.used.tolist()):
                    p.grad = view if u > 0 else None
            else:
                for p, view in zip(b.params, b.views):
                    if p.grad is not view:
                        p.grad = view
            b.reset()
        self._next = 0
        self._sync_buffers()
        self._dirty = False
        # comm_seconds already holds launch time from the hooks of this step
        self.comm_seconds += time.perf_counter() - t0
        self.total_comm_seconds += self.comm_seconds
        self.last_comm_seconds = self.comm_seconds
        self.comm_seconds = 0.0

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        if self.buffer_mode == "none":
            return
        bufs = list(self.module.buffers())
        if not bufs:
            return
        if self.buffer_mode == "broadcast":
            broadcast_tensors(bufs, self._root, self.group)
            return
        floats = [b for b in bufs if b.is_floating_point()]
        others = [b for b in bufs if not b.is_floating_point()]
        if floats:
            flat = torch.cat([b.reshape(-1) for b in floats])
            comm.all_reduce(flat, op=comm.AVG, group=self.group)
            offset = 0
            for b in floats:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        if others:
            # Integer buffers (e.g. BatchNorm's num_batches_tracked) cannot be averaged.
            broadcast_tensors(others, self._root, self.group)

    # -- module API ------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._dirty and self._next > 0 and torch.is_grad_enabled():
            raise RuntimeError(
                "DataParallel: the previous step's gradients were never synchronized. "
                "Pass optimizer= to DataParallel or call model.synchronize() before "
                "optimizer.step()."
            )
        if self.training and torch.is_grad_enabled() and self._sync_enabled:
            self._dirty = True
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside this block.

        Example::

            with model.no_sync():
                loss_fn(model(x1), y1).backward()   # local only
            loss_fn(model(x2), y2).backward()       # averages the sum of both
        """
        prev = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = prev

    def remove_hooks(self) -> None:
        """Detach from the module and optimizer (the module stays usable alone)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
