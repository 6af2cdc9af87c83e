"""The project's own ring allreduce: chunked, pipelined reduce-scatter then all-gather.

The flat buffer of ``N`` elements is cut into ``n`` chunks (sizes differ by at most
one element, so any ``N`` and any rank count work, including ``N < n``). In step
``u`` of ``2(n-1)`` each rank sends chunk ``(r-u) mod n`` to its right neighbour and
receives chunk ``(r-u-1) mod n`` from its left: for the first ``n-1`` steps into a
scratch buffer that is then reduced into the chunk (reduce-scatter), afterwards
straight into place (all-gather). Every chunk is further cut into segments, and
each segment moves through the steps on its own, so while one segment is being
reduced the next is already on the wire (the pipeline). Each rank sends and
receives ``2(n-1)/n * N`` elements, independent of ``n``: the bandwidth-optimal
schedule of the Baidu/DeepSpeech and Horovod rings.

Traffic goes over the group's private communicator with a per-call tag, so rings
never match user messages or each other, and several may be outstanding.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel.comm import _hugepages
from clusterkernel.comm._dtypes import DType, as_numpy, unstage
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Call, Work, drive
from clusterkernel.comm._ops import AVG, ReduceOp

# Segment size: large enough that per-segment Python work is small against the
# copy, small enough that reduction overlaps the transfer (tuned in bench_comm).
SEGMENT_BYTES = 256 * 1024


def all_reduce(
    group: Group,
    tensor: torch.Tensor,
    w: torch.Tensor,
    info: DType,
    op: ReduceOp,
    async_op: bool,
    call: Call,
) -> Work | None:
    """Ring allreduce of ``tensor`` (already on the wire as ``w``) over ``group``;
    ``call`` its records (:meth:`~clusterkernel.comm._plan.Plan.call`)."""
    if not w.is_cpu:
        # Device memory reached MPI directly (CUDA-aware), but the ring reduces
        # with numpy: it works on a host copy, copied back at the end.
        w = w.detach().to("cpu")
    data = as_numpy(w, info)
    if data.nbytes >= _hugepages.THRESHOLD and w.is_cpu:
        _hugepages.note_buffer(w.data_ptr(), data.nbytes)
    steps = _steps_then_unstage(group, data, info, op, tensor, w)
    return drive(call, steps, async_op)


def _steps_then_unstage(group, data, info, op, tensor, w) -> Generator:
    yield from ring_steps(group, data, info, op)
    unstage(tensor, w)


def ring_steps(group: Group, data: np.ndarray, info: DType, op: ReduceOp) -> Generator:
    """Step generator reducing the flat array ``data`` in place over ``group``."""
    n = group.size
    if n == 1 or data.size == 0:
        return
    ufunc = op.ufunc[info.kind]
    divisor = n if op is AVG else 1
    yield from _ring(group.inner(), group.next_tag(), data, info.mpi, ufunc, divisor)


def _bounds(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def _ring(
    comm: MPI.Intracomm,
    tag: int,
    data: np.ndarray,
    mpitype: MPI.Datatype,
    ufunc: np.ufunc,
    divisor: int,
) -> Generator:
    n = comm.Get_size()
    r = comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunk = _bounds(data.size, n)
    maxchunk = chunk[1] - chunk[0]  # the first chunk is never smaller than the others
    nseg = max(1, -(-maxchunk * data.itemsize // SEGMENT_BYTES))
    # seg[c][k] = (start, stop) of segment k of chunk c, in elements of data
    seg = [
        [(chunk[c] + a, chunk[c] + b) for a, b in _pairs(_bounds(chunk[c + 1] - chunk[c], nseg))]
        for c in range(n)
    ]
    seglen = -(-maxchunk // nseg)
    scratch = _take_scratch(nseg * seglen, data.dtype).reshape(nseg, seglen)
    last_rs = n - 2  # last reduce-scatter step
    nsteps = 2 * (n - 1)
    sends: list[list] = [[] for _ in range(nseg)]  # pending (step, request) per segment
    current: list = [None] * nseg

    def post(u: int, k: int) -> None:
        a, b = seg[(r - u) % n][k]
        sends[k].append((u, comm.Isend([data[a:b], mpitype], right, tag)))
        ra, rb = seg[(r - u - 1) % n][k]
        target = scratch[k, : rb - ra] if u <= last_rs else data[ra:rb]
        current[k] = (comm.Irecv([target, mpitype], left, tag), ra, rb, target)

    for k in range(nseg):
        post(0, k)
    for u in range(nsteps):
        for k in range(nseg):
            req, ra, rb, target = current[k]
            yield [req]
            if u <= last_rs:
                view = data[ra:rb]
                ufunc(view, target, out=view)
                if u == last_rs and divisor != 1:
                    np.divide(view, divisor, out=view)
            nxt = u + 1
            if nxt < nsteps:
                if nxt > last_rs:
                    # All-gather receives overwrite data: the send that read this
                    # region (n-1 steps earlier) must be finished.
                    done_before = nxt - (n - 1)
                    old = [q for s, q in sends[k] if s <= done_before]
                    sends[k] = [(s, q) for s, q in sends[k] if s > done_before]
                    if old:
                        yield old
                post(nxt, k)
    rest = [q for pending in sends for _, q in pending]
    if rest:
        yield rest
    _give_scratch(scratch)


# Free scratch buffers by (dtype, size): a fresh one per call would cost page
# faults and zeroing on every call. In use by one ring at a time.
_SCRATCH: dict[tuple[str, int], list[np.ndarray]] = {}


def _take_scratch(count: int, dtype: np.dtype) -> np.ndarray:
    free = _SCRATCH.get((np.dtype(dtype).str, count))
    return free.pop() if free else _hugepages.empty(count, dtype)


def _give_scratch(arr: np.ndarray) -> None:
    free = _SCRATCH.setdefault((arr.dtype.str, arr.size), [])
    if len(free) < 2:
        free.append(arr.reshape(-1))


def _pairs(bounds: list[int]) -> list[tuple[int, int]]:
    return list(zip(bounds[:-1], bounds[1:]))
