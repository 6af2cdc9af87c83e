"""Synchronous data parallelism: bucketed gradient allreduce overlapped with backward."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.comm._shm import alloc as shm_alloc
from clusterkernel.train._reducer import GradReducer
from clusterkernel.train._sync import broadcast_tensors, check_replicas, world_rank
from clusterkernel.train.comm_hooks import CommHook, fp16_compress_hook

_COMPRESSION = (None, "fp16")
_BUFFERS = ("average", "broadcast", "none")

# Every DataParallel alive in this process, by its number: wrapping is collective, so
# the k-th wrap has the same number on every rank (what a respawn matches them by).
_LIVE: weakref.WeakValueDictionary[int, DataParallel] = weakref.WeakValueDictionary()
_next_number = 0  # the next wrap's number; agreed by every rank at each respawn


def _take_number() -> int:
    global _next_number
    _next_number += 1
    return _next_number - 1


class DataParallel(nn.Module):
    """Wrap a model for synchronous data-parallel training over all ranks.

    At wrap time it checks that every rank built the same model (and optimizer),
    then copies rank 0's parameters and buffers to all ranks. During ``backward()``
    each parameter's gradient lands in a bucket (buckets fill in reverse parameter
    order, the order backward produces them); as soon as a bucket is full its
    averaging allreduce starts asynchronously, so communication overlaps the rest
    of backward. :meth:`synchronize` waits for all buckets; it runs by itself
    before ``optimizer.step()`` when the optimizer is passed in, otherwise call it
    yourself. After every step all ranks hold bit-identical parameters. How a
    bucket is averaged is a comm hook, as in torch DDP (default: an ``all_reduce``;
    see :meth:`register_comm_hook` and :mod:`clusterkernel.train.comm_hooks`).

    ``p.grad`` of every parameter is a view into its bucket. With
    ``zero_grad(set_to_none=True)`` (torch's default) each step's fresh
    gradients are copied into the bucket once; ``set_to_none=False`` avoids that.
    On one node the buckets are in shared memory (``shared_buckets``), which the
    other ranks write into while a step's averaging runs: read ``p.grad`` after
    :meth:`synchronize` (as the optimizer does), not between backward and it.
    Save ``model.module.state_dict()`` to get the plain model's keys.

    Example::

        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        model = DataParallel(net, optimizer=opt)
        for x, y in loader:                  # this rank's shard
            opt.zero_grad(set_to_none=False) # keeps .grad in the buckets: no copies
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
            The same as ``register_comm_hook(None, comm_hooks.fp16_compress_hook)``.
        buffers: ``"average"`` (default) averages floating buffers such as
            BatchNorm running statistics at every synchronize, ``"broadcast"``
            copies rank 0's, ``"none"`` leaves them per rank.
        group: a communicator group from ``comm.new_group`` (default: all ranks).
        shared_buckets: where the buckets live. ``None`` (default): in the group's
            shared memory (:func:`comm.shm_empty <clusterkernel.comm.shm_empty>`)
            when all its ranks share one node, the parameters are on CPU and some
            bucket reaches ``comm``'s zero-copy size (512 KB), else ordinary
            memory; the default hook then averages each such bucket in place,
            with no copy in or out (``CLUSTERKERNEL_ALGORITHM`` forcing another
            algorithm than shm means ordinary memory). ``True``: shared memory
            or a clear error (on every rank; a one-rank group has nothing to
            share and keeps ordinary memory); ``False``: ordinary memory. Pass
            the same value on every rank (a clear error otherwise). Decided
            collectively at wrap time; see :attr:`shared_buckets`. Shared
            memory is kept until the process exits, and a new wrap reuses that
            of a wrapped model which is gone (re-running a cell costs no new
            memory); models alive at once each hold their gradients' size of it.

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
        group: comm.Group | None = None,
        shared_buckets: bool | None = None,
    ):
        """Check the replicas agree, copy rank 0's state to every rank, set up the buckets.

        ``optimizer``: its ``step()`` then waits for the gradients by itself;
        ``bucket_bytes``: gradient bytes per allreduce; ``compression="fp16"``: half the
        bytes on the wire; ``buffers``: what happens to buffers (BatchNorm statistics)
        each step, ``"average"``, ``"broadcast"`` from rank 0 or ``"none"``; ``group``:
        the ranks that train together (default all); ``shared_buckets``: where the
        buckets live (the class docstring says when each choice helps).

        Example::

            model = DataParallel(net, optimizer=opt, bucket_bytes=4 << 20)
        """
        super().__init__()
        if compression not in _COMPRESSION:
            raise ValueError(f"compression must be one of {_COMPRESSION}, got {compression!r}.")
        if buffers not in _BUFFERS:
            raise ValueError(f"buffers must be one of {_BUFFERS}, got {buffers!r}.")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}.")
        if shared_buckets not in (None, True, False):
            raise ValueError(f"shared_buckets must be None, True or False, got {shared_buckets!r}.")
        self.module = module
        self.group = group
        self.compression = compression
        self.buffer_mode = buffers
        self._settings = {"bucket_bytes": bucket_bytes, "shared_buckets": shared_buckets}
        self._optimizer = optimizer
        self._number = _take_number()
        self._old_windows = False  # a respawn left windows to give back (reattach)
        _LIVE[self._number] = self
        check_replicas(module, optimizer, group)
        self._attach()

    def _attach(self) -> None:
        """Rank 0's state to every rank, the buckets and hooks (collective)."""
        module, group = self.module, self.group
        self.world = comm.size(group)
        self._root = world_rank(group, 0)
        broadcast_tensors([*module.parameters(), *module.buffers()], self._root, group)
        params = [p for p in module.parameters() if p.requires_grad]  # shared ones once
        self._reducer = GradReducer(
            params, self._settings["bucket_bytes"], group, self._settings["shared_buckets"]
        )
        self._hook_set = False
        if self.compression == "fp16":
            self.register_comm_hook(None, fp16_compress_hook)
        # cached: walking the module tree every step is slow for many small layers
        self._buffers_list = list(module.buffers())
        self._step_hook = None
        if self._optimizer is not None:
            self._step_hook = self._optimizer.register_step_pre_hook(lambda *_: self.synchronize())

    def __reduce__(self):
        # What a respawned rank receives in its copy of a survivor's variables: the
        # module and optimizer (shared with the copy's other names), re-attached by
        # rebuild_after_respawn, never the buckets or hooks.
        return (
            _unattached,
            (self.module, self._optimizer, self.group, self.compression, self.buffer_mode,
             self._settings, self._number),
        )  # fmt: skip

    def reattach(self) -> None:
        """After a respawn: new buckets and hooks in the new world, rank 0's state to
        every rank (collective over the model's ranks; :func:`rebuild_after_respawn`).

        Shared buckets of the old world are let go first, so that their memory goes
        back (before the new window is made, or at the next forward where the failed
        step's error still viewed them): a ``p.grad`` in them becomes None (as on the
        new rank, whose copy carries no gradients)."""
        old = getattr(self, "_reducer", None)
        if old is not None:
            self.remove_hooks()
            if old.shared:
                _let_go_of(old)
        # The local too: it would keep the old reducer's buckets (the dead world's
        # window) alive while _attach() makes the new window.
        self._reducer = old = None
        self._attach()
        # A failed step's error, alive while the recovery runs, may still view the old
        # buckets: the next forward gives back what nothing views by then.
        self._old_windows = True

    @property
    def last_comm_seconds(self) -> float:
        """Seconds this rank spent launching and waiting for the last step's allreduces."""
        return self._reducer.last_comm_seconds

    @property
    def total_comm_seconds(self) -> float:
        """The same, summed over all steps so far."""
        return self._reducer.total_comm_seconds

    @property
    def shared_buckets(self) -> bool:
        """Whether the gradient buckets (and so every ``p.grad``) are in the group's
        shared memory (the same on every rank).

        Example: ``DataParallel(net).shared_buckets``  (True on one node, on CPU)
        """
        return self._reducer.shared

    @property
    def buckets(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [[names[id(p)] for p in b.params] for b in self._reducer.buckets]

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Average each bucket with ``hook(state, bucket)`` instead of the default.

        As torch DDP's: call it once, before the first backward. ``hook`` gets a
        :class:`~clusterkernel.train.comm_hooks.GradBucket` and returns a
        :class:`~clusterkernel.train.comm_hooks.CommFuture` whose value is the
        bucket's average over the ranks (a tensor of the bucket's size); ``state``
        is passed as is (the built-in hooks take a group, or None for this
        model's).

        Example::

            from clusterkernel.train import comm_hooks

            model = DataParallel(net, optimizer=opt)
            model.register_comm_hook(None, comm_hooks.fp16_compress_hook)
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable as hook(state, bucket), got {hook!r}.")
        if self._hook_set:
            what = "compression='fp16'" if self.compression else "register_comm_hook"
            raise RuntimeError(
                f"DataParallel already has a comm hook (set by {what}); register at most "
                "one, and pass compression=None to register your own."
            )
        if self._reducer.dirty:
            raise RuntimeError(
                "DataParallel: register_comm_hook during a step; register before the "
                "first forward, or after synchronize()."
            )
        self._reducer.hook, self._reducer.state = hook, state
        self._hook_set = True

    def synchronize(self) -> None:
        """Finish the gradient averaging of this step (and the buffer sync).

        Launches buckets whose parameters got no gradient on this rank (with
        zeros), waits for all allreduces, and leaves the averaged gradients in
        ``p.grad``. Calling it again before the next forward does nothing.
        """
        if self._reducer.synchronize():
            self._sync_buffers()

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        bufs = self._buffers_list
        if self.buffer_mode == "none" or not bufs:
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
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped module; in training, arm this step's gradient averaging.

        Raises if the previous step's gradients were never synchronized, since
        mixing two steps' allreduces would hang or corrupt the average.
        """
        red = self._reducer
        if self._old_windows:
            self._old_windows = False
            shm_alloc.release_stale()
        if red.launched and torch.is_grad_enabled():
            raise RuntimeError(
                "DataParallel: the previous step's gradients were never synchronized. "
                "Pass optimizer= to DataParallel or call model.synchronize() before "
                "optimizer.step()."
            )
        if self.training and red.enabled and torch.is_grad_enabled():
            red.dirty = True
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside this block.

        Example::

            model = DataParallel(net, optimizer=opt)
            with model.no_sync():
                loss_fn(model(x1), y1).backward()   # local only
            loss_fn(model(x2), y2).backward()       # averages the sum of both
        """
        red = self._reducer
        prev = red.enabled
        red.enabled = False
        try:
            yield
        finally:
            red.enabled = prev

    def remove_hooks(self) -> None:
        """Detach from the module and optimizer (the module stays usable alone)."""
        self._reducer.remove()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None


def _let_go_of(reducer: GradReducer) -> None:
    # No tensor may view the old buckets' window any more once it is given back.
    for b in reducer.buckets:
        where = b.flat.untyped_storage().data_ptr()
        for p in b.params:
            if p.grad is not None and p.grad.untyped_storage().data_ptr() == where:
                p.grad = None
    reducer.buckets = []


def _unattached(module, optimizer, group, compression, buffers, settings, number) -> DataParallel:
    """A DataParallel as unpickled on a respawned rank: no buckets until reattached."""
    self = DataParallel.__new__(DataParallel)
    nn.Module.__init__(self)
    self.module, self._optimizer, self.group = module, optimizer, group
    self.compression, self.buffer_mode, self._settings = compression, buffers, settings
    self._number, self._reducer, self._step_hook = number, None, None
    self._old_windows = False
    _LIVE[number] = self
    return self


def wrap_state() -> tuple[list[int], int]:
    """``(numbers of the live DataParallel models, the next wrap's number)`` of this rank."""
    import gc

    gc.collect()  # a model dropped but still in a cycle must not count as alive
    return sorted(_LIVE), _next_number


def rebuild_after_respawn(every: list[tuple[list[int], int]]) -> list[int]:
    """After a respawn, with every rank's :func:`wrap_state` (``every``, in rank order):
    re-attach the DataParallel models every rank has (matched by wrap number), in
    order, and detach those only some ranks have; every rank counts on from the same
    next number. Collective over the models' ranks. Returns the numbers re-attached."""
    global _next_number
    common = sorted(set.intersection(*(set(numbers) for numbers, _ in every)))
    _next_number = max(max([nxt, *(n + 1 for n in numbers)]) for numbers, nxt in every)
    for number in sorted(_LIVE):
        dp = _LIVE.get(number)
        if dp is None:
            continue
        if number in common:
            dp.reattach()
        elif getattr(dp, "_reducer", None) is not None:
            dp.remove_hooks()  # its peer is gone for good
    return common
