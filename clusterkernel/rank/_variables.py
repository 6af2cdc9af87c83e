"""A rank's user variables as one pickle, and put back into its live namespace (rank side).

A snapshot (``_snapshot``) and a respawned rank's copy of a peer (``_respawn``) pickle
the variables here and load them back with :func:`put_back`. Functions and classes
defined in cells go by value (cloudpickle), and every function whose globals were the
user namespace comes back with the *live* user namespace of the rank that loads it as
``__globals__``: methods of cell classes, closures, lambdas, partials, functions in
lists or dicts included. cloudpickle alone would give them a new dict holding the
globals they name, so ``global step; step += 1`` in a restored helper would advance a
private copy while the cells read another, and ranks would silently disagree.

Example (what ``_snapshot.save`` and ``load`` do)::

    blob, names, skipped = pickled(user_namespace())
    put_back(*pickle.loads(blob))       # bump.__globals__ is globals() on this rank
"""

from __future__ import annotations

import importlib
import io
import os
import sys
import types

import cloudpickle

# the rank-side libraries (torchdist's rewrap and Keeper) ask for it there
from clusterkernel.protocol._engine import user_namespace

# names IPython and ipyparallel put in every namespace
_NOT_COPIED = {"In", "Out", "exit", "quit", "get_ipython", "open"}


def _hidden() -> set[str]:
    from IPython import get_ipython

    shell = get_ipython()
    return set(shell.user_ns_hidden) if shell is not None else set()


def _copied(name: str, hidden: set[str]) -> bool:
    return not (name.startswith("_") or name in _NOT_COPIED or name in hidden)


def variables() -> list[str]:
    """The names of the user's variables (those :func:`pickled` considers), sorted."""
    hidden = _hidden()
    return sorted(n for n in user_namespace() if _copied(n, hidden))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with ``namespace`` (the user namespace) kept as a function's globals
    by reference: such a function is made on load with the loading rank's namespace."""

    def __init__(self, file, namespace: dict) -> None:
        super().__init__(file, protocol=5)
        self._namespace = namespace

    def reducer_override(self, obj):
        reduced = super().reducer_override(obj)
        if (
            reduced is NotImplemented
            or not isinstance(obj, types.FunctionType)
            or obj.__globals__ is not self._namespace
        ):
            return reduced
        # cloudpickle's reduction is (make, (code, globals, name, defaults, closure),
        # state, None, None, its state setter): the same, minus the globals dict
        _make, (code, _globals, name, defaults, closure), state, items, pairs, setter = reduced
        live = (code, name, defaults, closure)
        return _live_function, live, (setter, state), items, pairs, _set_live_state


def _live_function(code, name, defaults, closure) -> types.FunctionType:
    return types.FunctionType(code, user_namespace(), name, defaults, closure)


def _set_live_state(func: types.FunctionType, state) -> None:
    setter, (attrs, slots) = state
    ns = func.__globals__
    # The state holds the globals the function names, as they were where it was pickled.
    # They fill only names the live namespace lacks (a function restored alone still
    # runs); a live variable is never replaced behind the user's back: the values a
    # restore or copy asked for are put back after the load, by put_back.
    slots["__globals__"] = {k: v for k, v in slots["__globals__"].items() if k not in ns}
    builtins = ns.get("__builtins__")
    setter(func, (attrs, slots))
    if builtins is not None:  # cloudpickle's setter puts its own module's there
        ns["__builtins__"] = builtins


def dumps(value) -> bytes:
    """``value`` pickled (protocol 5), cell functions bound to the user namespace on load."""
    out = io.BytesIO()
    _Pickler(out, user_namespace()).dump(value)
    return out.getvalue()


def pickled(ns: dict) -> tuple[bytes, list[str], dict[str, str]]:
    """``(blob, names, skipped)``: one pickle of ``ns``'s picklable variables and modules
    (by name), the names in it, and why the rest are not.

    One pickle, so objects shared between variables stay shared; made once when every
    value pickles, else again without the values that do not. :func:`put_back` loads it.
    """
    hidden = _hidden()
    values, modules, skipped = {}, {}, {}
    for name, value in ns.items():
        if not _copied(name, hidden):
            continue
        if type(value) is type(os):
            modules[name] = value.__name__
            continue
        if "torch.nn.parallel" in sys.modules:  # a DDP model goes as its module
            from clusterkernel.torchdist._rewrap import for_copy

            value = for_copy(value)
        values[name] = value
    try:
        blob = dumps((values, modules))
    except Exception:
        for name in list(values):
            try:
                dumps(values[name])
            except Exception as e:
                skipped[name] = f"{type(values.pop(name)).__name__}: {e}"[:200]
        blob = dumps((values, modules))
    return blob, sorted([*values, *modules]), skipped


def put_back(values: dict, modules: dict[str, str], names: set[str] | None = None) -> list[str]:
    """Assign the unpickled ``values`` and ``modules`` of :func:`pickled` (``names`` of
    them, or all) in the user namespace itself; the names put back, sorted."""
    ns = user_namespace()
    done = []
    for name, module in modules.items():
        if names is None or name in names:
            ns[name] = importlib.import_module(module)
            done.append(name)
    for name, value in values.items():
        if names is None or name in names:
            ns[name] = value
            done.append(name)
    return sorted(done)
