"""The last step before a call moves data: the check and the flight entry.

Every tensor call, collective or point-to-point, opens the same way: ``g, c =
member(group)`` (the group and its communicator; a clear error for a non-member),
its signature's plan looked up in the group's ``_plans`` (made, and the signature
validated, on its first call: :mod:`._plan`), then :func:`enter`, then
``plan.run(...)``. :func:`enter` notes the call in the flight recorder and runs the
check the plan's signature is due (:mod:`._check`: new signatures by default, every
call in mode ``"every"``, none for point-to-point calls). The calls that have no
plan (object calls, CUDA tensors handed to torch.distributed) take :func:`begin`,
the same step from the signature's fields; both run the check through
:func:`_run_check`.
"""

from __future__ import annotations

import torch

from clusterkernel.comm import _check
from clusterkernel.comm._flight import FLIGHT
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import ReduceOp
from clusterkernel.comm._plan import Plan, agreed

# _check.STATE bound here: begin() runs on every collective, and a module global is one
# lookup where _check.STATE is two
_CHECK_STATE = _check.STATE


def begin(
    g: Group,
    name: str,
    tensor: torch.Tensor | None = None,
    *,
    nbytes: int | None = None,
    op: ReduceOp | None = None,
    root: int | None = None,
    alg: str | None = None,
    count: int = -1,
    extra: int = -1,
    detail: str = "size",
) -> list | None:
    """Check the call across ``g`` and return its flight entry (see the module docstring).

    ``op`` must be parsed already and ``root`` a world rank, so that equal calls
    give equal check keys on every rank. ``detail="dtype"`` for calls whose sizes
    may differ per rank (all-to-all, objects).
    """
    dtype = tensor.dtype if tensor is not None else None
    if nbytes is None:
        nbytes = tensor.nbytes if tensor is not None else 0
    # Noted before the check: a rank left waiting inside the check (it passed a new
    # signature while the others passed an agreed one) still shows this call.
    flight = FLIGHT
    entry = flight.record(g, name, nbytes, dtype, depth=3) if flight.on else None
    check = _CHECK_STATE
    if check.on or check.new:
        numel = tensor.numel() if tensor is not None and detail != "dtype" else -1
        key = (name, dtype, numel, op, root, alg, count, extra)
        if check.on or key not in g._sigs:
            _run_check(g, key, name, tensor, detail, entry)
    return entry


def enter(
    g: Group, plan: Plan, tensor: torch.Tensor | None = None, nbytes: int = -1
) -> list | None:
    """The flight entry of one call of ``plan`` on ``g``, after the check it is due.

    ``tensor`` is the one the check describes; ``nbytes`` the entry's bytes where
    they vary per call under one plan (all-to-all; -1: ``plan.size``). Noted before
    the check, as :func:`begin` does. The caller is three frames out (``enter`` is
    called by the public call).
    """
    flight = FLIGHT
    if flight.on:
        size = plan.size if nbytes < 0 else nbytes
        entry = flight.record(g, plan.name, size, plan.dtype, plan.peer, 3)
    else:
        entry = None
    sig = plan.sig
    if sig is None:  # point-to-point: not checked
        return entry
    check = _CHECK_STATE
    if check.on or (check.new and not agreed(g, plan)):
        _run_check(g, sig, plan.name, tensor, plan.detail, entry)
        agreed(g, plan)  # agreed now: the next call (in C too) knows it
    return entry


def _run_check(
    g: Group, key: tuple, name: str, tensor: torch.Tensor | None, detail: str, entry: list | None
) -> None:
    """The check one call is due: shapes too in mode "every", else agree on ``key``.

    ``key`` is the signature ``(name, dtype, numel, op, root, alg, count, extra)``.
    If the check raises (it does on every rank), ``entry`` is abandoned: nobody
    waits in that call.
    """
    _, _, _, op, root, alg, count, extra = key
    try:
        if _CHECK_STATE.on:
            _check.verify(g, name, tensor, op=op, root=root, alg=alg, count=count, extra=extra)
        else:
            _check.agree(
                g, key, name, tensor, op=op, root=root, alg=alg, count=count, extra=extra,
                detail=detail,
            )  # fmt: skip
    except BaseException:
        abandon(entry)
        raise
