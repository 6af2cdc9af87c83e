"""The last step before a collective moves data: the check and the flight entry.

Every collective opens the same way: ``g, c = member(group)`` (the group and its
communicator; a clear error for a non-member), then its own local validation (so
bad input fails on its rank before any message is sent), then :func:`begin`, then
the MPI call. :func:`begin` runs the check (:mod:`._check`: new signatures by
default, every call in check mode) and notes the call in the flight recorder.
"""

from __future__ import annotations

import torch

from clusterkernel.comm import _check
from clusterkernel.comm._flight import FLIGHT
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import ReduceOp

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
    try:
        if _CHECK_STATE.on:  # mode "every"
            _check.verify(g, name, tensor, op=op, root=root, alg=alg, count=count, extra=extra)
        elif _CHECK_STATE.new:  # mode "new"
            numel = tensor.numel() if tensor is not None and detail != "dtype" else -1
            key = (name, dtype, numel, op, root, alg, count, extra)
            if key not in g._sigs:
                _check.agree(
                    g,
                    key,
                    name,
                    tensor,
                    op=op,
                    root=root,
                    alg=alg,
                    count=count,
                    extra=extra,
                    detail=detail,
                )
    except BaseException:
        abandon(entry)  # it raised on every rank: nobody waits in it
        raise
    return entry
