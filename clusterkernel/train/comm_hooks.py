"""Communication hooks of :class:`~clusterkernel.train.DataParallel`, as in torch DDP.

A hook decides how one bucket of gradients is averaged over the ranks::

    hook(state, bucket) -> CommFuture   # its value: the bucket's average, same shape

``bucket`` is a :class:`GradBucket` (``buffer()`` is the flat tensor of its
gradients); ``state`` is whatever was registered with the hook. DataParallel
calls the hook when the bucket is ready (during backward), waits for the
future in ``synchronize()``, and copies its value back into the gradients.
Hooks are small and compose: :func:`fp16_compress_wrapper` turns any averaging
hook into one that sends float16.

- :func:`allreduce_hook` (the default): ``all_reduce`` with ``AVG``;
- :func:`fp16_compress_hook`: half the bytes, ``fp16_compress_wrapper(allreduce_hook)``
  (what ``DataParallel(compression="fp16")`` registers);
- :func:`fp16_compress_wrapper`: float16 around any hook.

Example (one hook per model, registered before the first backward)::

    from clusterkernel.train import DataParallel, comm_hooks

    model = DataParallel(net, optimizer=opt)
    model.register_comm_hook(None, comm_hooks.fp16_compress_hook)

    # a hook of your own: count the bytes, then average as the default does
    def counted(sent: list, bucket: comm_hooks.GradBucket) -> comm_hooks.CommFuture:
        sent.append(bucket.buffer().nbytes)
        return comm_hooks.allreduce_hook(None, bucket)

    sent = []
    other = DataParallel(net2, optimizer=opt2)
    other.register_comm_hook(sent, counted)   # state: passed to every call
    loss_fn(other(x), y).backward()           # sent: the bytes of every bucket
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from clusterkernel import comm
from clusterkernel.train import _fp16

_HALF = (torch.float16, torch.bfloat16)


class CommFuture:
    """The value a communication produces: :meth:`wait` blocks for it.

    Made from a call started with ``async_op=True`` and the tensor it fills
    (``CommFuture(work, tensor)``), from a value at hand
    (``CommFuture.completed(tensor)``), or by :meth:`then`. As torch's
    ``Future``, ``then`` callbacks receive the finished future; a callback
    may start more communication and return its future.

    Example::

        work = comm.all_reduce(t, op=comm.SUM, async_op=True)
        fut = CommFuture(work, t).then(lambda f: f.value().div_(comm.size()))
        mean = fut.wait()
    """

    __slots__ = ("_work", "_value", "_parent", "_callback", "_done")

    def __init__(self, work: Any = None, value: Any = None):
        self._work = work  # anything with wait(), e.g. comm's Work; None: already done
        self._value = value
        self._parent: CommFuture | None = None
        self._callback: Callable[[CommFuture], Any] | None = None
        self._done = work is None

    @classmethod
    def completed(cls, value: Any) -> CommFuture:
        """A future whose value is already there."""
        return cls(None, value)

    def then(self, callback: Callable[[CommFuture], Any]) -> CommFuture:
        """A future of ``callback(self)``, run once this one is done."""
        fut = CommFuture.__new__(CommFuture)
        fut._work, fut._value, fut._done = None, None, False
        fut._parent, fut._callback = self, callback
        return fut

    def wait(self) -> Any:
        """Block until the value is there; return it."""
        if not self._done:
            if self._parent is not None:
                self._parent.wait()
                value = self._callback(self._parent)
                self._parent = self._callback = None
                if isinstance(value, CommFuture):
                    value = value.wait()
                self._value = value
            else:
                self._work.wait()
                self._work = None
            self._done = True
        return self._value

    def value(self) -> Any:
        """The value of a finished future (inside a ``then`` callback)."""
        if not self._done:
            raise RuntimeError("CommFuture.value() before the future is done; call wait().")
        return self._value

    def done(self) -> bool:
        """True once :meth:`wait` has returned."""
        return self._done


class GradBucket:
    """One bucket of gradients handed to a comm hook.

    - ``buffer()``: the flat tensor to average (gradients, then one "used" flag
      per parameter, which must be averaged along); with DataParallel's shared
      buckets it lies in the group's shared memory, so ``comm.all_reduce`` of it
      (the whole buffer, or the same slice on every rank, from 512 KB) runs in place;
    - ``index``: the bucket's place in launch order; ``is_last()``: the final one
      of the step (launched when backward is done, nothing left to overlap);
    - ``parameters()``: the parameters whose gradients it holds;
    - ``group``: the DataParallel's group (``None``: all ranks);
    - ``scratch(name, numel, dtype)``: a buffer kept with the bucket from step to
      step, so a hook allocates its working tensors once.

    Example (a hook that averages with a plain allreduce, as the default does)::

        def my_hook(state, bucket: GradBucket) -> CommFuture:
            work = comm.all_reduce(bucket.buffer(), op=comm.AVG, async_op=True,
                                   group=bucket.group)
            return CommFuture(work, bucket.buffer())
    """

    __slots__ = ("index", "group", "_buffer", "_params", "_last", "_scratch")

    def __init__(
        self,
        index: int,
        buffer: torch.Tensor,
        params: list[torch.nn.Parameter],
        last: bool,
        group: comm.Group | None,
        scratch: dict | None = None,
    ):
        self.index = index
        self.group = group
        self._buffer = buffer
        self._params = params
        self._last = last
        self._scratch = {} if scratch is None else scratch

    def buffer(self) -> torch.Tensor:
        """The flat tensor to average."""
        return self._buffer

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients are in the buffer, in buffer order."""
        return self._params

    def is_last(self) -> bool:
        """Whether this is the step's last bucket."""
        return self._last

    def scratch(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` values, the same one every step (zeros when new)."""
        t = self._scratch.get(name)
        if t is None or t.numel() != numel or t.dtype != dtype:
            t = self._scratch[name] = torch.zeros(numel, dtype=dtype)
        return t

    def with_buffer(self, buffer: torch.Tensor) -> GradBucket:
        """The same bucket over another buffer (e.g. a compressed copy)."""
        return GradBucket(self.index, buffer, self._params, self._last, self.group, self._scratch)


#: ``hook(state, bucket) -> CommFuture`` whose value is the bucket's average
CommHook = Callable[[Any, GradBucket], CommFuture]


def allreduce_hook(state: comm.Group | None, bucket: GradBucket) -> CommFuture:
    """Average the bucket with ``all_reduce(AVG)`` over ``state`` or the bucket's group.

    The last bucket uses a blocking call: nothing is left to overlap with, and
    MPI's blocking allreduce is markedly faster than its nonblocking one
    (BENCHMARKS.md, "Synchronous data-parallel training", what made the difference).
    Float16 and bfloat16 buffers are summed in float32 but travel in their own type
    (:func:`_half_average`).

    Example::

        model = DataParallel(net, optimizer=opt)
        model.register_comm_hook(None, allreduce_hook)   # the default
    """
    group = bucket.group if state is None else state
    buf = bucket.buffer()
    if buf.dtype in _HALF:
        return _half_average(bucket, group)
    if bucket.is_last():
        comm.all_reduce(buf, op=comm.AVG, group=group)
        return CommFuture.completed(buf)
    return CommFuture(comm.all_reduce(buf, op=comm.AVG, async_op=True, group=group), buf)


def _half_average(bucket: GradBucket, group: comm.Group | None) -> CommFuture:
    """Average a half-precision buffer and keep it half-precision on the wire.

    MPI has no half-precision sum, and a reduction through float32 would send
    float32. So: an all-to-all of chunks (each rank receives every rank's copy
    of its own chunk), a local float32 sum, and an all-gather of the averaged
    chunks into the buffer. Half the bytes of float32 both ways.
    """
    buf, n = bucket.buffer(), comm.size(group)
    numel, dtype = buf.numel(), buf.dtype
    chunk = -(-numel // n)
    wire = buf
    if chunk * n != numel:  # pad to n equal chunks (the padding stays zero)
        wire = bucket.scratch("half_wire", chunk * n, dtype)
        wire[:numel].copy_(buf)
    inbox = bucket.scratch("half_inbox", chunk * n, dtype)
    work = comm.all_to_all_single(inbox, wire, group=group, async_op=True)

    def gather(_: CommFuture) -> CommFuture:
        total = bucket.scratch("half_sum", chunk, torch.float32)
        torch.sum(inbox.view(n, chunk), 0, dtype=torch.float32, out=total)
        mine = bucket.scratch("half_mine", chunk, dtype)
        mine.copy_(total.div_(n))
        done = comm.all_gather_into_tensor(wire, mine, group=group, async_op=True)
        if wire is buf:
            return CommFuture(done, buf)
        return CommFuture(done).then(lambda _: buf.copy_(wire[:numel]))

    return CommFuture(work).then(gather)


def fp16_compress_wrapper(hook: CommHook) -> CommHook:
    """``hook`` on a float16 copy of the bucket: half the bytes on the wire.

    The gradients are rounded to float16 (about 1e-3 relative precision;
    magnitudes above 65504 overflow), ``hook`` averages the copy, and the
    result comes back in the buffer's own dtype.

    Example::

        model = DataParallel(net, optimizer=opt)
        model.register_comm_hook(None, fp16_compress_wrapper(allreduce_hook))
    """

    def fp16_hook(state: Any, bucket: GradBucket) -> CommFuture:
        buf = bucket.buffer()
        half = _fp16.compress(buf, bucket.scratch("fp16", buf.numel(), _fp16.WIRE_DTYPE))
        fut = hook(state, bucket.with_buffer(half))
        return fut.then(lambda f: _fp16.decompress(f.value(), buf))

    fp16_hook.__name__ = f"fp16_{getattr(hook, '__name__', 'hook')}"
    return fp16_hook


#: average in float16 on the wire: ``fp16_compress_wrapper(allreduce_hook)``
fp16_compress_hook = fp16_compress_wrapper(allreduce_hook)
fp16_compress_hook.__name__ = "fp16_compress_hook"
