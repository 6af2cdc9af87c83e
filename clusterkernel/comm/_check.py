"""Checks that every rank of a group enters the same collective with the same op,
size and dtype, so a mismatch raises instead of hanging or returning garbage.

Three modes (:func:`set_check`, read with :func:`check_mode`):

- ``"new"`` (the default): the first call of each new signature (op, dtype, element
  count, reduce op, root, algorithm) on a group is checked; repeats of an agreed
  signature cost one set lookup. A rank whose call differs from the others' is
  caught before any data moves, the first time it happens.
- ``"every"`` (``CLUSTERKERNEL_COMM_CHECK=every``): each call is checked, shapes
  included.
- ``"off"`` (``CLUSTERKERNEL_COMM_CHECK=off``): no check; a mismatch may then hang or
  give wrong values.

A check is one ``Allgather`` of 16 int64 (a signature) on a private duplicate
communicator, so it never mixes with user traffic. If signatures differ, every rank
raises :class:`CollectiveMismatchError` naming the ranks and what each one called.
Why skipping agreed signatures is safe: every member adds a signature to its set only
after all members agreed on it, so the sets are the same on every rank and all
members make the same decision to check or not. A rank that passes an agreed
signature while another passes a new one is left waiting (the hang report then names
the mismatch from the flight recorder). Point-to-point calls are not checked.
"""

from __future__ import annotations

import os
import warnings
import zlib

import numpy as np
import torch

from clusterkernel.comm._errors import CollectiveMismatchError
from clusterkernel.comm._gate import changed
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ops import ALL_OPS, ReduceOp
from clusterkernel.protocol._calls import CHECKED_CALLS
from clusterkernel.protocol.records import human_bytes

_SIG_LEN = 16
_MAX_DIMS = 6
# the torch path's backends last: the indices before them are in agreed signatures
_ALGS = ("mpi", "ring", "shm", "hier", "auto", "gloo", "nccl")


_MAX_SEEN = 256  # agreed signatures kept per group; cleared (on every member) when full
MODES = ("new", "every", "off")
# The spellings set_check took before the modes had names: they still work, and warn.
_OLD_SPELLINGS = {True: "every", False: "new", "all": "every"}


def _env_mode(value: str) -> str:
    """The mode ``CLUSTERKERNEL_COMM_CHECK`` asks for: a mode's name; unset, empty or
    ``0``: ``"new"``; any other value (``1``, ``all``: the older spellings): ``"every"``."""
    value = value.strip().lower()
    if value in MODES:
        return value
    return "new" if value in ("", "0") else "every"


class _State:
    """The mode as two flags, read on every collective's path
    (:func:`~._plan.check_due`): ``on`` is true in mode ``"every"``, ``new`` in
    ``"new"`` and ``"every"``. :func:`set_check` sets them; nothing else should."""

    on = False  # mode "every": every call is checked
    new = True  # mode "new" or "every": new signatures are checked (and agreed)


STATE = _State()


def _apply(mode: str) -> None:
    STATE.on = mode == "every"
    STATE.new = mode != "off"
    changed()  # the C path's answers assumed the old mode (_gate)


def set_check(mode: str = "every") -> None:
    """Choose how this rank's collectives are checked (choose the same on every rank).

    ``"new"`` (the default mode): the first call of each new signature on a group.
    ``"every"``: every call, shapes included. ``"off"``: no check (a mismatch may
    then hang or give wrong values); no argument: ``"every"``. :func:`check_mode`
    says which is in force; ``CLUSTERKERNEL_COMM_CHECK`` sets the mode a rank starts
    in.

    The older spellings ``True`` / ``"all"`` (for ``"every"``) and ``False`` (for
    ``"new"``) still work and raise a :class:`DeprecationWarning`.

    Example::

        comm.set_check("every")
        comm.all_reduce(t)   # raises CollectiveMismatchError on every rank if another
                             # rank called broadcast, or passed another shape/dtype
        comm.set_check("new")
    """
    if isinstance(mode, (bool, str)) and mode in _OLD_SPELLINGS:
        new = _OLD_SPELLINGS[mode]
        warnings.warn(
            f"set_check({mode!r}) is deprecated: use set_check({new!r})",
            DeprecationWarning,
            stacklevel=2,
        )
        mode = new
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"set_check takes 'new', 'every' or 'off', got {mode!r}")
    _apply(mode)


def check_mode() -> str:
    """This rank's check mode: ``"new"`` (the default), ``"every"`` or ``"off"``.

    Example::

        comm.check_mode()   # 'new'
    """
    if STATE.on:
        return "every"
    return "new" if STATE.new else "off"


def check_enabled() -> bool:
    """Whether *every* call is checked on this rank (mode ``"every"``).

    False in the default mode ``"new"``, where new signatures are still checked, and
    in mode ``"off"``; :func:`check_mode` names the mode.
    """
    return STATE.on


_apply(_env_mode(os.environ.get("CLUSTERKERNEL_COMM_CHECK", "")))


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


_DTYPE_NAMES = {
    d: str(d).replace("torch.", "") for d in vars(torch).values() if isinstance(d, torch.dtype)
}
_DTYPE_CODES = {name: _code(name) for name in set(_DTYPE_NAMES.values())}
_DTYPE_BY_CODE = {code: name for name, code in _DTYPE_CODES.items()}
_OP_BY_CODE = {_code(o.name): o.name for o in ALL_OPS}
_CALL_BY_CODE = {_code(n): n for n in CHECKED_CALLS}


def signature(
    name: str,
    tensor: object = None,
    op: object = None,
    root: object = None,
    alg: str | None = None,
    count: int = -1,
    extra: int = -1,
    detail: str = "shape",
) -> np.ndarray:
    """Encode one call as 16 int64 (unknown fields are -1).

    ``detail`` says how much of the tensor must match: ``"shape"``, ``"size"`` (the
    element count) or ``"dtype"`` (calls whose sizes may differ per rank).
    """
    sig = np.full(_SIG_LEN, -1, dtype=np.int64)
    sig[0] = _code(name)
    if op is not None:
        opname = op.name if isinstance(op, ReduceOp) else str(op).upper()
        sig[1] = _code(opname)
    if root is not None:
        sig[2] = root if isinstance(root, int) else -2
    if isinstance(tensor, torch.Tensor):
        sig[3] = _DTYPE_CODES.get(_DTYPE_NAMES.get(tensor.dtype, ""), -2)
        if detail != "dtype":
            sig[5] = tensor.numel()
        if detail == "shape":
            dims = tuple(tensor.shape)
            sig[4] = len(dims)
            sig[6 : 6 + min(len(dims), _MAX_DIMS)] = dims[:_MAX_DIMS]
            if len(dims) > _MAX_DIMS:
                sig[12] = _code(repr(dims[_MAX_DIMS:]))
    elif tensor is not None:
        sig[3] = -2  # not a tensor
    if alg is not None:
        sig[13] = _ALGS.index(alg) if alg in _ALGS else _code(str(alg))
    sig[14] = count
    sig[15] = extra
    return sig


def layout_code(layout: object) -> int:
    """A code for shapes and dtypes of a list of tensors (``all_reduce_coalesced``)."""
    return _code(repr(layout))


def describe(sig: np.ndarray) -> str:
    """Human-readable form of a signature, e.g. ``all_reduce(float32[4, 3], op=SUM)``."""
    name = _CALL_BY_CODE.get(int(sig[0]), "<unknown call>")
    parts = []
    if sig[3] == -2:
        parts.append("<not a tensor>")
    elif sig[3] != -1:
        dtype = _DTYPE_BY_CODE.get(int(sig[3]), "?")
        if sig[5] == -1:  # checked by dtype only
            parts.append(dtype)
        elif sig[4] == -1:  # checked by size only
            n = int(sig[5])
            nbytes = n * torch.empty(0, dtype=getattr(torch, dtype, torch.uint8)).element_size()
            parts.append(f"{dtype}, {n} elements ({human_bytes(nbytes)})")
        else:
            dims = [int(d) for d in sig[6 : 6 + min(int(sig[4]), _MAX_DIMS)]]
            more = ", ..." if sig[4] > _MAX_DIMS else ""
            parts.append(f"{dtype}[{', '.join(map(str, dims))}{more}]")
    if sig[14] != -1:
        parts.append(f"count={int(sig[14])}")
    if sig[15] != -1:
        parts.append(f"shapes/dtypes#{int(sig[15]):08x}")
    if sig[1] != -1:
        parts.append(f"op={_OP_BY_CODE.get(int(sig[1]), '<invalid>')}")
    if sig[2] != -1:
        parts.append(f"root={int(sig[2])}" if sig[2] >= 0 else "root=<invalid>")
    if sig[13] != -1:
        alg = _ALGS[int(sig[13])] if 0 <= sig[13] < len(_ALGS) else "?"
        parts.append(f"algorithm={alg}")
    return f"{name}({', '.join(parts)})"


def agree(group: Group, key: tuple, name: str, tensor: object = None, **fields: object) -> None:
    """The default check, for a ``key`` the group has not agreed on yet (callers test
    ``key in group._sigs`` first): verify the call, then remember ``key``.

    ``key`` must hold exactly what the signature holds, in canonical form (parsed
    op, world-rank root, dtype, element count), so equal keys mean equal signatures.
    """
    seen = group._sigs
    verify(group, name, tensor, **fields)
    if len(seen) >= _MAX_SEEN:
        seen.clear()
        group._sig_gen += 1  # plans that cached "agreed" look again
        changed()  # and the C path asks Python again (_gate)
    seen.add(key)


def verify(group: Group, name: str, tensor: object = None, **fields: object) -> None:
    """Exchange signatures over ``group``; raise on every rank if they differ."""
    mine = signature(name, tensor, **fields)
    everyone = np.empty((group.size, _SIG_LEN), dtype=np.int64)
    group.inner().Allgather(mine, everyone)
    if (everyone == everyone[0]).all():
        return
    raise CollectiveMismatchError(mismatch_message(group, everyone))


def mismatch_message(group: Group, everyone: np.ndarray) -> str:
    variants: dict[bytes, list[int]] = {}
    for i, row in enumerate(everyone):
        variants.setdefault(row.tobytes(), []).append(group.ranks[i])
    # The largest set of agreeing ranks is taken as what was intended.
    ordered = sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    lines = []
    for key, ranks in ordered:
        label = "rank" if len(ranks) == 1 else "ranks"
        sig = np.frombuffer(key, dtype=np.int64)
        lines.append(f"  {label} {', '.join(map(str, ranks))}: {describe(sig)}")
    differ = sorted(r for _, ranks in ordered[1:] for r in ranks)
    return (
        f"collective mismatch in {group.name}: ranks {differ} differ from ranks "
        f"{ordered[0][1]}.\n" + "\n".join(lines) + "\nEvery rank of the group must make the "
        "same collective call, with the same op, root, shape and dtype, in the same order."
    )
