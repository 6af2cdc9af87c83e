"""The shared-memory all-reduce's chunk loop in C (``_cpipe``) against the Python loop:
taken for float32 and float64 SUM and AVG, bit-identical results on the same inputs
(one chunk, many, sizes that are no multiple of a chunk, async calls on two groups
interleaved), ranks on either loop working together, and the Python loop for the rest;
the same for the in-place reduction of tensors from ``shm_empty``."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from _helpers import RANK, SIZE, agree

from clusterkernel import comm
from clusterkernel.comm._shm import pipe
from clusterkernel.comm._shm.segment import PIPE_CHUNK

DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def _c_on():
    if SIZE < 2:
        pytest.skip("the pipeline runs on two ranks or more")
    if not pipe.c_built():
        # Built by every install with a C compiler; this machine has one.
        agree(not sys.platform.startswith("linux"), "the C loop is not built")
        pytest.skip("no C loop on this platform")
    was = pipe.c_loop(True)
    yield
    pipe.c_loop(was)


def _values(seed: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    # Values of many magnitudes, so the order of the additions shows in the last bits.
    rng = np.random.default_rng([seed, rank])
    vals = rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)
    return torch.from_numpy(vals).to(dtype)


def _inputs(seed: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    return _values(seed, RANK, count, dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int64)


def _same_bits(xs: list, ys: list) -> list[bool]:
    return [bool(torch.equal(_bits(a), _bits(b))) for a, b in zip(xs, ys)]


def _sizes(dtype: torch.dtype) -> list[int]:
    per = PIPE_CHUNK // dtype.itemsize  # elements in a full chunk
    small = pipe.SMALL // dtype.itemsize  # up to this the single-exchange path runs
    return [
        small + 1,  # one chunk, no multiple of 64 bytes
        per,  # one full chunk
        3 * per,  # whole chunks only
        2 * per + 5,  # a last chunk of 5: most ranks' share of it is empty
        9 * per + 12_345,  # many chunks, more than the stage buffers
    ]


def _run(tensors: list, op, groups: list, c: bool, blocking: bool = False) -> int:
    """Allreduce each tensor on its group with the C loop on or off; the C calls done.
    Async: all outstanding at once, waited in a different order on odd ranks."""
    pipe.c_loop(c)
    before = pipe.c_hits()
    if blocking:
        for t, g in zip(tensors, groups):
            comm.all_reduce(t, op=op, group=g, algorithm="shm")
    else:
        works = [
            comm.all_reduce(t, op=op, group=g, async_op=True, algorithm="shm")
            for t, g in zip(tensors, groups)
        ]
        for w in reversed(works) if RANK % 2 else works:
            w.wait()
    return pipe.c_hits() - before


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [comm.SUM, comm.AVG], ids=str)
def test_the_c_loop_gives_the_python_loops_bits(dtype, op):
    sizes = _sizes(dtype)
    groups = [None] * len(sizes)
    for blocking in (True, False):
        ins = [_inputs(k + 10 * blocking, n, dtype) for k, n in enumerate(sizes)]
        py = [x.clone() for x in ins]
        cc = [x.clone() for x in ins]
        py_hits = _run(py, op, groups, c=False, blocking=blocking)
        hits = _run(cc, op, groups, c=True, blocking=blocking)
        same = _same_bits(py, cc)
        what = f"{dtype} {op} blocking={blocking}: same bits {same}, C calls {py_hits}, {hits}"
        agree(all(same) and py_hits == 0 and hits == len(sizes), what)


def test_async_calls_on_two_groups_interleaved():
    a, b = comm.new_group(list(range(SIZE))), comm.new_group(list(range(SIZE)))
    groups = [a, b, a, b, b, a]
    sizes = [70_001, 300_000, 1 << 20, 17_000, 524_289, 65_536]
    dts = [torch.float32, torch.float64] * 3
    ins = [_inputs(40 + k, n, dt) for k, (n, dt) in enumerate(zip(sizes, dts))]
    py = [x.clone() for x in ins]
    cc = [x.clone() for x in ins]
    py_hits = _run(py, comm.SUM, groups, c=False)
    hits = _run(cc, comm.SUM, groups, c=True)
    same = _same_bits(py, cc)
    comm.destroy_group(a)
    comm.destroy_group(b)
    agree(all(same) and py_hits == 0 and hits == len(sizes), f"{same}, C calls {py_hits}, {hits}")


def test_ranks_on_either_loop_work_together():
    # The same buffers, counters and chunk numbers: even ranks in C, odd ones in Python.
    dtype = torch.float64
    sizes = _sizes(dtype)
    groups = [None] * len(sizes)
    for op in (comm.SUM, comm.AVG):
        ins = [_inputs(60 + k, n, dtype) for k, n in enumerate(sizes)]
        py = [x.clone() for x in ins]
        mixed = [x.clone() for x in ins]
        _run(py, op, groups, c=False)
        hits = _run(mixed, op, groups, c=RANK % 2 == 0)
        same = _same_bits(py, mixed)
        want_hits = len(sizes) if RANK % 2 == 0 else 0
        agree(all(same) and hits == want_hits, f"{op}: {same}, C calls {hits}")


def test_the_c_loop_is_near_the_exact_sum():
    # Both loops wrong alike would pass the tests above: each rank rebuilds every
    # rank's input and checks the result against their sum in float64.
    dtype, count = torch.float32, 4 * PIPE_CHUNK // 4 + 777
    for op in (comm.SUM, comm.AVG):
        t = _inputs(3, count, dtype)
        hits = _run([t], op, [None], c=True, blocking=True)
        want = sum(_values(3, r, count, dtype).double().numpy() for r in range(SIZE))
        if op is comm.AVG:
            want = want / SIZE
        got = t.double().numpy()
        ok = np.allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        agree(bool(ok) and hits == 1, f"{op}: C calls {hits}")


@pytest.mark.parametrize(
    "dtype, op",
    [(torch.bfloat16, comm.SUM), (torch.int32, comm.SUM), (torch.float32, comm.MAX)],
    ids=str,
)
def test_the_other_cases_stay_in_python(dtype, op):
    count = 200_003
    t = torch.full((count,), float(RANK + 1)).to(dtype)
    hits = _run([t], op, [None], c=True, blocking=True)
    want = SIZE if op is comm.MAX else SIZE * (SIZE + 1) // 2
    agree(bool((t == want).all()) and hits == 0, f"{dtype} {op}: C calls {hits}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_in_place_reduction_in_c_gives_pythons_bits(dtype):
    # Tensors from shm_empty are reduced where they lie (no stage buffers): each rank
    # sums its share of all of them and writes it into every one. Even ranks in C and
    # odd ones in Python work together too: each share is one rank's alone.
    sizes = [_sizes(dtype)[k] for k in (0, 2, 4)]
    bufs = [comm.shm_empty(n, dtype=dtype) for n in sizes]
    for op in (comm.SUM, comm.AVG):
        out = {}
        for mode, on in (("python", False), ("c", True), ("mixed", RANK % 2 == 0)):
            for k, (b, n) in enumerate(zip(bufs, sizes)):
                b.copy_(_inputs(80 + k, n, dtype))
            hits = _run(bufs, op, [None] * len(bufs), c=on, blocking=True)
            out[mode] = ([b.clone() for b in bufs], hits)
        (py, py_hits), (cc, c_hits), (mixed, _) = out["python"], out["c"], out["mixed"]
        same = _same_bits(py, cc) + _same_bits(py, mixed)
        # both ways wrong alike would pass that: every rank's input rebuilt, summed in
        # float64
        want = sum(_values(81, r, sizes[1], dtype).double().numpy() for r in range(SIZE))
        if op is comm.AVG:
            want = want / SIZE
        got = cc[1].double().numpy()
        near = np.allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        agree(
            all(same) and bool(near) and py_hits == 0 and c_hits == len(sizes),
            f"{dtype} {op}: same bits {same}, near {near}, C calls {py_hits}, {c_hits}",
        )
