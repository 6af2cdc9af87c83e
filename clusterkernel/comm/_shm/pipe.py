"""The shared-memory all-reduce as a pipeline of cache-sized chunks (:mod:`._shm`).

A tensor is cut into chunks of at most :data:`~.segment.PIPE_CHUNK` bytes
(smaller for mid sizes, so they pipeline too). Chunk ``g`` (counted over the
group's whole life, the same on every member) goes through stage buffer
``g % PIPE_DEPTH`` of every rank:

1. *in*: copy the chunk into this rank's stage buffer, publish ``IN = g + 1``;
2. *reduce*: once every rank's ``IN > g``, reduce this rank's share of the chunk
   across all ranks' buffers into rank 0's buffer, publish ``RED = g + 1``;
3. *out*: once every rank's ``RED > g``, copy rank 0's buffer out, publish
   ``OUT = g + 1``.

The stages are software-pipelined (in of chunk ``c``, reduce of ``c - 1``, out of
``c - 2``), so a rank rarely waits, and a chunk's copy in, reduce and copy out hit
the cache instead of memory. A buffer is written again only once every rank's
``OUT`` says the chunk it held was copied out everywhere. The counters are plain
int64 stores in one cache line per rank, ordered by ``Win.Sync`` (a memory
barrier) as the MPI shared-memory model asks: no MPI call, so a chunk costs a few
microseconds of Python. A waiting rank gives up its core (``sched_yield``): with
more ranks than cores the rank it waits for needs it.

The common case (float32 or float64 summed or averaged, the tensor in its slot
dtype) runs the same loop in C (``_cpipe.c``), with the same buffers, counters,
chunk numbers and order of additions, so its results are the Python loop's bit for
bit; the waiting stays here. So does the in-place reduction of tensors from
:func:`~.alloc.shm_empty` (:func:`~.alloc.zero_copy_reduce`'s steps). Without the
extension (no C compiler at install) Python does it all.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from clusterkernel.comm._shm.alloc import find, peers, zero_copy_reduce
from clusterkernel.comm._shm.segment import PIPE_CHUNK, PIPE_DEPTH, Segment
from clusterkernel.comm._shm.steps import share

try:
    from clusterkernel.comm._shm import _cpipe
except ImportError:  # not built: the Python loop runs every call
    _cpipe = None

IN, RED, OUT = 0, 1, 2  # columns of a rank's counter line: progress
ARENA, OFFSET = 3, 4  # and which shm_empty allocation (1-based; 0: none) at what offset
MIN_CHUNK = 16 * 1024  # bytes: below this a chunk costs more in Python than in copies
_MAX_VIEWS = 64  # cached view sets per segment (a training loop has a handful of sizes)
SMALL = 64 * 1024  # bytes: up to this, one exchange and every rank reduces it all
PIECES = 1  # a mid-size tensor is cut into about this many chunks, so it pipelines
_IN_C = [_cpipe is not None]  # whether the chunk loop's common case runs in C (c_loop)
_C_DTYPES = (torch.float32, torch.float64)


def c_loop(on: bool = True) -> bool:
    """Run the chunk loop's common case, and the in-place reduction's, in C (on) or in
    Python (off) on this rank; returns whether it was on. Both give the same results;
    tests compare them.

    Example: ``was = c_loop(False)`` ... ``c_loop(was)``.
    """
    if on and _cpipe is None:
        raise RuntimeError("the shared-memory pipeline's C loop (_cpipe) is not built here")
    was = _IN_C[0]
    _IN_C[0] = on
    return was


def c_built() -> bool:
    """Whether the C loop (``_cpipe``) was built here."""
    return _cpipe is not None


def c_hits() -> int:
    """How many all-reduce calls the C loop has finished on this rank (0 when not built)."""
    return _cpipe.hits() if _cpipe is not None else 0


def chunk_elems(count: int, itemsize: int) -> int:
    """Elements per chunk for a tensor of ``count`` elements (a multiple of 64 bytes)."""
    full = PIPE_CHUNK // itemsize
    want = -(-count // PIECES)
    want = max(MIN_CHUNK // itemsize, -(-want * itemsize // 64) * 64 // itemsize)
    return min(full, want)


_ADD = torch.Tensor.add_  # the fold of SUM and AVG on floats (steps.fold_for)


def _behind(col, target: int) -> bool:
    for v in col:
        if v < target:
            return True
    return False


def _views(seg: Segment, sdt: torch.dtype, size: int) -> tuple:
    """Per stage buffer ``k``: (this rank's first ``size`` elements, its share of rank
    0's, the other ranks' same shares, rank 0's first ``size``): made once per
    (dtype, chunk size) and kept, so a chunk does no tensor indexing."""
    key = (sdt, size)
    views = seg.pipes.get(key)
    if views is not None:
        return views
    n, r = seg.n, seg.rank
    rows = seg.stage_rows(sdt)
    a, b = share(size, n, r, sdt.itemsize)
    views = tuple(
        (
            rows[r, k, :size],
            rows[0, k, a:b] if a < b else None,
            tuple(rows[j, k, a:b] for j in range(1, n)),
            rows[0, k, :size],
        )
        for k in range(PIPE_DEPTH)
    )
    if len(seg.pipes) >= _MAX_VIEWS:
        seg.pipes.clear()
    seg.pipes[key] = views
    return views


def steps_for(seg: Segment, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int) -> Generator:
    """The all-reduce steps for ``flat``: one exchange when small, else
    :func:`large_steps`."""
    if flat.numel() * sdt.itemsize <= SMALL:
        return small_steps(seg, flat, sdt, fold, divisor)
    return large_steps(seg, flat, sdt, fold, divisor)


def large_steps(
    seg: Segment, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int
) -> Generator:
    """A first exchange says where every rank's tensor is: when all are in the same
    :func:`~.alloc.shm_empty` allocation, reduce them in place (no copies in or
    out); otherwise run the pipeline."""
    if seg.n == 1:
        return
    win, mine = seg.pipe_win, seg.mine
    col_in, _, col_out = seg.cols
    g = seg.seq
    seg.seq = g + 1
    arena, offset = find(seg, flat)
    mine[ARENA] = arena
    mine[OFFSET] = offset
    win.Sync()
    mine[IN] = g + 1
    while _behind(col_in, g + 1):
        seg.pause()
        yield None
    win.Sync()
    ctl = seg.ctl
    zero_copy = arena > 0 and all(v == arena for v in ctl[:, ARENA])
    offsets = [int(v) for v in ctl[:, OFFSET]] if zero_copy else None
    if not zero_copy:
        mine[OUT] = g + 1  # read the others' lines; used no stage buffer
        yield from all_reduce_steps(seg, flat, sdt, fold, divisor)
        return
    ts = peers(seg.arenas[arena - 1], offsets, flat)
    if _in_c(fold, flat, sdt):
        a, b = share(flat.numel(), seg.n, seg.rank, sdt.itemsize)
        ptrs = tuple(t.data_ptr() for t in ts)
        _cpipe.zero_copy(ptrs, seg.rank, sdt.itemsize, a, b, divisor, PIPE_CHUNK // sdt.itemsize)
    else:
        zero_copy_reduce(seg, ts, sdt, fold, divisor)
    win.Sync()
    mine[OUT] = g + 1  # done with every rank's tensor
    while _behind(col_out, g + 1):  # and so is everyone with mine
        seg.pause()
        yield None
    win.Sync()


def all_reduce_steps(
    seg: Segment, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int
) -> Generator:
    """Allreduce the contiguous 1-d ``flat`` in place; yields ``None`` while waiting
    for other ranks (the driver polls again)."""
    n = seg.n
    count = flat.numel()
    if n == 1 or count == 0:
        return
    e = chunk_elems(count, sdt.itemsize)
    m = -(-count // e)
    base = seg.seq
    seg.seq = base + m
    if _in_c(fold, flat, sdt):
        run = _c_run(seg, flat, e, m, base, divisor)
        while not run.step():
            seg.pause()
            yield None
        return
    win, mine = seg.pipe_win, seg.mine
    col_in, col_red, col_out = seg.cols
    pieces = flat.split(e)
    full = _views(seg, sdt, e)
    last = full if count % e == 0 else _views(seg, sdt, count % e)
    for s in range(m + 2):
        if s < m:  # copy chunk s in
            g = base + s
            if g >= PIPE_DEPTH:
                while _behind(col_out, g - PIPE_DEPTH + 1):
                    seg.pause()
                    yield None
                win.Sync()
            (last if s == m - 1 else full)[g % PIPE_DEPTH][0].copy_(pieces[s])
            win.Sync()
            mine[IN] = g + 1
        c = s - 1
        if 0 <= c < m:  # reduce this rank's share of chunk c
            g = base + c
            while _behind(col_in, g + 1):
                seg.pause()
                yield None
            win.Sync()
            _, acc, others, _ = (last if c == m - 1 else full)[g % PIPE_DEPTH]
            if acc is not None:
                for x in others:
                    fold(acc, x)
                if divisor != 1:
                    acc.div_(divisor)
            win.Sync()
            mine[RED] = g + 1
        c = s - 2
        if c >= 0:  # copy chunk c out
            g = base + c
            while _behind(col_red, g + 1):
                seg.pause()
                yield None
            win.Sync()
            pieces[c].copy_((last if c == m - 1 else full)[g % PIPE_DEPTH][3])
            win.Sync()
            mine[OUT] = g + 1


def _in_c(fold, flat: torch.Tensor, sdt: torch.dtype) -> bool:
    """Whether this call's loop runs in C: float32 or float64 summed (or averaged) in
    its own dtype on the CPU, with the C loop built and on."""
    return _IN_C[0] and fold is _ADD and flat.dtype is sdt and sdt in _C_DTYPES and flat.is_cpu


def _c_run(seg: Segment, flat: torch.Tensor, e: int, m: int, base: int, divisor: int):
    """The C loop (``_cpipe.Run``) of one call: ``m`` chunks ``base ..`` of ``e`` elements."""
    count, size, n, r = flat.numel(), flat.element_size(), seg.n, seg.rank
    return _cpipe.Run(
        seg.raw,  # the counters at its start; held while the call runs
        seg.stage.data_ptr(),
        flat,  # held while the call runs
        flat.data_ptr(),
        seg.ctl.shape[1],  # int64s per rank's counter line
        n,
        r,
        PIPE_DEPTH,
        PIPE_CHUNK,
        count,
        e,
        size,
        base,
        divisor,
        share(e, n, r, size),
        share(count - (m - 1) * e, n, r, size),  # the last chunk's
    )


def small_now(seg: Segment, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int) -> None:
    """:func:`small_steps` for a blocking call with nothing outstanding: no generator."""
    g, bufs = _small_claim(seg, flat, sdt)
    if g >= PIPE_DEPTH:
        col = seg.cols[OUT]
        while _behind(col, g - PIPE_DEPTH + 1):
            seg.pause()
    _small_in(seg, bufs, flat, g)
    col = seg.cols[IN]
    while _behind(col, g + 1):
        seg.pause()
    _small_reduce(seg, bufs, flat, sdt, fold, divisor, g)


def small_steps(
    seg: Segment, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int
) -> Generator:
    """One chunk, one wait: every rank copies in, then reduces the whole chunk across
    all buffers itself (in the same order everywhere, so the results are identical)."""
    g, bufs = _small_claim(seg, flat, sdt)
    if g >= PIPE_DEPTH:
        col = seg.cols[OUT]
        while _behind(col, g - PIPE_DEPTH + 1):
            seg.pause()
            yield None
    _small_in(seg, bufs, flat, g)
    col = seg.cols[IN]
    while _behind(col, g + 1):
        seg.pause()
        yield None
    _small_reduce(seg, bufs, flat, sdt, fold, divisor, g)


def _small_claim(seg: Segment, flat: torch.Tensor, sdt: torch.dtype) -> tuple:
    g = seg.seq
    seg.seq = g + 1
    count = flat.numel()
    key = (sdt, -count)  # negative: the whole-buffer views of a small call
    views = seg.pipes.get(key)
    if views is None:
        rows = seg.stage_rows(sdt)
        views = tuple(tuple(rows[:, k, :count]) for k in range(PIPE_DEPTH))
        if len(seg.pipes) >= _MAX_VIEWS:
            seg.pipes.clear()
        seg.pipes[key] = views
    return g, views[g % PIPE_DEPTH]


def _small_in(seg: Segment, bufs: tuple, flat: torch.Tensor, g: int) -> None:
    win = seg.pipe_win
    win.Sync()  # every rank's reads of this buffer (chunk g - PIPE_DEPTH) are over
    bufs[seg.rank].copy_(flat)
    win.Sync()
    seg.mine[IN] = g + 1


def _small_reduce(
    seg: Segment, bufs: tuple, flat: torch.Tensor, sdt: torch.dtype, fold, divisor: int, g: int
) -> None:
    win = seg.pipe_win
    win.Sync()
    acc = flat if sdt is flat.dtype else seg.scratch(sdt, flat.numel())
    acc.copy_(bufs[0])
    for x in bufs[1:]:
        fold(acc, x)
    win.Sync()
    seg.mine[OUT] = g + 1  # done reading the buffers of chunk g
    if divisor != 1:
        acc.div_(divisor)
    if acc is not flat:
        flat.copy_(acc)
