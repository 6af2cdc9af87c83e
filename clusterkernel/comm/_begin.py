"""The last step before a call moves data: the check and the flight entry.

Every tensor call, collective or point-to-point, opens the same way: ``g, c =
member(group)`` (the group and its communicator; a clear error for a non-member),
its signature's plan looked up in the group's ``_plans`` (made, and the signature
validated, on its first call: :mod:`._plan`), then :func:`enter`, then
``plan.run(...)``. :func:`enter` notes the call in the flight recorder and runs the
check the plan's signature is due (:func:`~._plan.check_due`: new signatures by
default, every call in mode ``"every"``, none for point-to-point calls), and returns
the call's :class:`~._handle.Call` (made by the plan: :meth:`~._plan.Plan.call`). The
calls that have no plan to keep (object calls, CUDA tensors handed to
torch.distributed, ``all_reduce_coalesced``) take :func:`begin`, which makes a plan
for the one call and enters it. :func:`step_entry` is the flight entry of work done
before a call (``auto``'s set-up), under the number of the call it precedes.
"""

from __future__ import annotations

import torch

from clusterkernel.comm import _check
from clusterkernel.comm._flight import FLIGHT
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Call
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import ReduceOp
from clusterkernel.comm._plan import Plan, agreed, check_due

# _check.STATE bound here: enter() runs on every collective, and a module global is one
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
    record_alg: str | None = None,
    count: int = -1,
    extra: int = -1,
    detail: str = "size",
    peer: int | None = None,
) -> Call:
    """Check a call that has no plan to keep across ``g`` and return its
    :class:`~._handle.Call` (see the module docstring): a plan for this one call.

    ``op`` must be parsed already and ``root`` a group rank, so that equal calls
    give equal signatures on every rank. ``alg`` is the algorithm the signature and
    the timing record name (``record_alg`` where the record's differs: ``"pkl5"`` for
    object calls, whose signatures name none). ``detail="dtype"`` for calls whose
    sizes may differ per rank (all-to-all, objects). ``peer`` (a group rank, -1: any
    source) makes it a point-to-point call: not checked.
    """
    if nbytes is None:
        nbytes = tensor.nbytes if tensor is not None else 0
    plan = Plan(
        g,
        name,
        None,
        None,
        size=nbytes,
        dtype=tensor.dtype if tensor is not None else None,
        alg=alg if record_alg is None else record_alg,
        asked=alg,
        numel=tensor.numel() if tensor is not None else -1,
        sig_count=count,
        extra=extra,
        op=op,
        detail=detail,
        root=root if peer is None else peer,
        peer=None if peer is None else (g.ranks[peer] if peer >= 0 else -1),
    )
    return enter(g, plan, tensor, depth=4)


def enter(
    g: Group, plan: Plan, tensor: torch.Tensor | None = None, nbytes: int = -1, depth: int = 3
) -> Call:
    """The :class:`~._handle.Call` of one call of ``plan`` on ``g``, after the check it
    is due (:func:`open_entry`, whose entry the call carries).

    ``tensor`` is the one the check describes; ``nbytes`` the bytes where they vary
    per call under one plan (all-to-all; -1: ``plan.size``). ``depth``: the frames
    between the flight recorder and the user's (``enter`` is called by the public
    call: 3).
    """
    return plan.call(open_entry(g, plan, tensor, nbytes, depth + 1), nbytes)


def open_entry(
    g: Group, plan: Plan, tensor: torch.Tensor | None = None, nbytes: int = -1, depth: int = 3
) -> int | None:
    """One call of ``plan`` on ``g`` begins: its flight entry (None while the flight
    recorder is off), noted before the check the call is due (a rank left waiting
    inside the check, because it passed a new signature while the others passed an
    agreed one, still shows this call). A call whose plan holds all its record's fields
    (all_reduce) keeps the entry and makes no :class:`~._handle.Call` unless it needs
    one (:meth:`~._plan.Plan.call`); arguments as :func:`enter`'s.
    """
    flight = FLIGHT
    if flight.on:
        size = plan.size if nbytes < 0 else nbytes
        entry = flight.record(g, plan.name, size, plan.dtype, plan.peer, depth)
    else:
        entry = None
    if check_due(g, plan):
        _run_check(g, plan, tensor, entry)
        agreed(g, plan)  # agreed now: the next call (in C too) knows it
    return entry


def step_entry(g: Group, what: str, nbytes: int = 0) -> int | None:
    """The flight entry of work a call does first (``auto``'s set-up): it takes the
    number of the group's next collective (the call it precedes) and no timing record
    (abandon it when done). None while the flight recorder is off."""
    flight = FLIGHT
    return flight.record(g, what, nbytes, None, depth=2, advance=False) if flight.on else None


def _run_check(g: Group, plan: Plan, tensor: torch.Tensor | None, entry: int | None) -> None:
    """The check one call is due: shapes too in mode "every", else agree on the
    plan's signature. If the check raises (it does on every rank), ``entry`` is
    abandoned: nobody waits in that call.
    """
    sig = plan.sig
    fields = {
        "op": sig.op,
        "root": sig.root,
        "alg": sig.alg,
        "count": sig.count,
        "extra": sig.extra,
    }
    try:
        if _CHECK_STATE.on:
            _check.verify(g, sig.name, tensor, **fields)
        else:
            _check.agree(g, sig, sig.name, tensor, detail=plan.detail, **fields)
    except BaseException:
        abandon(entry)
        raise
