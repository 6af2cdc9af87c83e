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
import pickle
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

    def __init__(self, file, namespace: dict, buffers: list | None = None) -> None:
        super().__init__(
            file, protocol=5, buffer_callback=None if buffers is None else buffers.append
        )
        self._namespace = namespace
        self._storages = _storage_types() if buffers is not None else ()

    def reducer_override(self, obj):
        if type(obj) in self._storages:
            reduced = _storage_out_of_band(obj)
            if reduced is not None:
                return reduced
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


def _storage_types() -> tuple:
    """The storage type a CPU tensor pickles through (none while torch is not imported;
    the few dtypes torch pickles with an untyped storage keep torch's own way)."""
    torch = sys.modules.get("torch")
    return () if torch is None else (torch.storage.TypedStorage,)


def _storage_out_of_band(storage):
    """A CPU storage reduced to its own bytes as an out-of-band buffer (pickle protocol 5):
    no copy here. torch's own reduction copies the bytes three or four times through new
    memory (a ``torch.save`` per storage, then into the pickle) and unpickling twice
    more, and first touches of new memory were most of a respawn's copy time
    (BENCHMARKS.md, "Faults", "The copy's page faults")."""
    import torch

    untyped = storage._untyped_storage
    if untyped.device.type != "cpu":
        return None
    raw = torch.empty(0, dtype=torch.uint8).set_(untyped)  # the storage's bytes, shared
    return _storage_from, (pickle.PickleBuffer(raw.numpy()), storage.dtype)


def _storage_from(buffer, dtype):
    """A storage of ``dtype`` over ``buffer`` itself (no copy). A torch tensor given as the
    buffer (pickle hands each object of ``buffers`` over as it is) lends its own storage:
    torch's memory, resizable as the sender's was (``copy_namespace`` receives into such
    tensors); any other buffer gets a storage over it."""
    import torch

    if isinstance(buffer, torch.Tensor):
        untyped = buffer.untyped_storage()
    elif memoryview(buffer).nbytes:
        untyped = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    else:
        untyped = torch.UntypedStorage(0)
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def dumps(value, buffers: list | None = None) -> bytes:
    """``value`` pickled (protocol 5), cell functions bound to the user namespace on load.

    With ``buffers`` (a list), the bytes of CPU tensors are not copied into the pickle:
    each storage's memory goes into ``buffers`` as a ``pickle.PickleBuffer``, in order, to
    be sent as it is and given back as ``pickle.loads(blob, buffers=...)`` (writable
    buffers, or uint8 torch tensors, of the same sizes: the tensors are made over them,
    without a copy).

    Example::

        bufs = []
        blob = dumps({"w": torch.ones(4)}, bufs)        # bufs: one buffer of 16 bytes
        pickle.loads(blob, buffers=[bytearray(b.raw()) for b in bufs])["w"]
    """
    out = io.BytesIO()
    _Pickler(out, user_namespace(), buffers).dump(value)
    return out.getvalue()


def pickled(ns: dict, buffers: list | None = None) -> tuple[bytes, list[str], dict[str, str]]:
    """``(blob, names, skipped)``: one pickle of ``ns``'s picklable variables and modules
    (by name), the names in it, and why the rest are not.

    One pickle, so objects shared between variables stay shared; made once when every
    value pickles, else again without the values that do not. :func:`put_back` loads it.
    ``buffers``: a list that gets the CPU tensors' bytes out of band (see :func:`dumps`).
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
        blob = dumps((values, modules), buffers)
    except Exception:
        for name in list(values):
            try:
                dumps(values[name], None if buffers is None else [])
            except Exception as e:
                skipped[name] = f"{type(values.pop(name)).__name__}: {e}"[:200]
        if buffers is not None:
            buffers.clear()  # those of the failed pickle
        blob = dumps((values, modules), buffers)
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
