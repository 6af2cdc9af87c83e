"""All-to-all: every rank sends a (possibly different-sized) part to every rank.

Names and argument order of ``torch.distributed``. Sizes may differ per pair of
ranks, so the check compares only the call and the dtype, and a plan (:mod:`._plan`)
holds little more than that: the signature and the MPI datatype; the counts and
displacements are worked out per call.
"""

from __future__ import annotations

from functools import partial

import torch

from clusterkernel.comm import _plan
from clusterkernel.comm._begin import enter
from clusterkernel.comm._dtypes import DType, buf, dtype_of, unstage, wire
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Call, Work, run
from clusterkernel.comm._tensorlists import same_dtype


def _flat_host(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    total = sum(t.numel() for t in tensors)
    out = torch.empty(total, dtype=dtype)
    pos = 0
    for t in tensors:
        n = t.numel()
        out[pos : pos + n].copy_(t.detach().reshape(-1))
        pos += n
    return out


def _vspec(w: torch.Tensor, info: DType, counts: list[int]) -> list:
    displs = [0] * len(counts)
    for i in range(1, len(counts)):
        displs[i] = displs[i - 1] + counts[i - 1]
    spec = buf(w, info)
    return [spec[0], (counts, displs), info.mpi]


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    pos = 0
    for t in tensors:
        n = t.numel()
        t.detach().copy_(flat[pos : pos + n].view(t.shape))
        pos += n


def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Group rank ``j`` receives ``input_tensor_list[j]`` of every rank ``i`` into its
    ``output_tensor_list[i]``. Sizes may differ per pair (they must agree pairwise).

    Example::

        ins = [torch.full((2,), float(comm.rank())) for _ in range(comm.size())]
        outs = [torch.empty(2) for _ in range(comm.size())]
        comm.all_to_all(outs, ins)     # outs[i] == i
    """
    g, c = member(group)
    n = g.size
    for what, lst in (
        ("output_tensor_list", output_tensor_list),
        ("input_tensor_list", input_tensor_list),
    ):
        if not isinstance(lst, (list, tuple)) or len(lst) != n:
            raise ValueError(f"all_to_all: {what} must be a list of {n} tensors (one per rank)")
    first = output_tensor_list[0]
    dtype_of(first, "output_tensor_list[0]")
    for t in [*output_tensor_list, *input_tensor_list]:
        dtype_of(t, "all_to_all tensor")
        if t.dtype != first.dtype:
            raise ValueError(
                f"all_to_all: found {t.dtype} and {first.dtype}; all tensors must share one dtype"
            )
    key = ("all_to_all", first.dtype)
    plan = _plan.find(g, key) or _plan_all_to_all(g, key, "all_to_all", input_tensor_list[0])
    ins, outs = list(input_tensor_list), list(output_tensor_list)
    call = enter(g, plan, ins[0], sum(t.nbytes for t in ins))
    return plan.run(plan, g, c, outs, ins, async_op, call)


def _plan_all_to_all(g: Group, key: tuple, name: str, tensor: torch.Tensor) -> _plan.Plan:
    """Plan a new all-to-all dtype (checked by dtype only: sizes may differ per rank)."""
    info = dtype_of(tensor)
    count = g.size if name == "all_to_all" else -1
    run = _run_all_to_all if name == "all_to_all" else _run_all_to_all_single
    plan = _plan.Plan(
        g, name, run, info, size=0, dtype=tensor.dtype, sig_count=count, detail="dtype"
    )
    return _plan.keep(g, key, plan)


def _run_all_to_all(plan, g: Group, c, outs, ins, async_op: bool, call: Call) -> Work | None:
    info = plan.info
    sendbuf = _flat_host(ins, plan.dtype)
    recvbuf = torch.empty(sum(t.numel() for t in outs), dtype=sendbuf.dtype)
    args = (
        _vspec(sendbuf, info, [t.numel() for t in ins]),
        _vspec(recvbuf, info, [t.numel() for t in outs]),
    )
    return run(
        call,  # its bytes: the entry's, sum(t.nbytes for t in ins) (enter)
        c.Alltoallv,
        c.Ialltoallv,
        args,
        finish=partial(_unflatten, recvbuf, outs),
        async_op=async_op,
        keep=(sendbuf, recvbuf),
    )


def _splits(sizes: list[int] | None, t: torch.Tensor, n: int, what: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if sizes is None:
        if rows % n:
            raise ValueError(
                f"all_to_all_single: {what} has {rows} rows, not divisible by {n} ranks; "
                f"pass {what.split()[0]}_split_sizes"
            )
        sizes = [rows // n] * n
    sizes = list(sizes)
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        raise ValueError(
            f"all_to_all_single: {what} split sizes {sizes} must be {n} non-negative ints "
            f"summing to its {rows} rows"
        )
    per_row = t.numel() // rows if rows else 0
    return [s * per_row for s in sizes]


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """All-to-all on single tensors split along dim 0 (equal splits by default).

    Example::

        inp = torch.arange(comm.size() * 2.0)
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
    """
    g, c = member(group)
    same_dtype(output, input, "all_to_all_single")
    scounts = _splits(input_split_sizes, input, g.size, "input")
    rcounts = _splits(output_split_sizes, output, g.size, "output")
    key = ("all_to_all_single", input.dtype)
    plan = _plan.find(g, key) or _plan_all_to_all(g, key, "all_to_all_single", input)
    call = enter(g, plan, input, input.nbytes)
    return plan.run(plan, g, c, output, input, scounts, rcounts, async_op, call)


def _run_all_to_all_single(
    plan, g: Group, c, output, input, scounts, rcounts, async_op: bool, call: Call
) -> Work | None:
    info = plan.info
    wi, _ = wire(input)
    wo, _ = wire(output, copy_in=False)
    finish = None if wo is output else partial(unstage, output, wo)
    args = (_vspec(wi, info, scounts), _vspec(wo, info, rcounts))
    return run(
        call,
        c.Alltoallv,
        c.Ialltoallv,
        args,
        finish=finish,
        async_op=async_op,
        keep=(wi, wo),
    )
