"""Every DDP model's gradient all-reduces on the dashboard, without code from the user (rank side).

On gloo, torch records no duration for a collective (its flight recorder has the
start only; ``ProcessGroup._register_on_completion_hook`` is NCCL's alone), so the
one exact source of DDP's traffic there is a communication hook. Once the rank
records metrics (``clusterkernel.log``, a comm call, or a dashboard's stream:
:func:`clusterkernel.metrics.recorder`), :func:`watch` makes every
``DistributedDataParallel`` built afterwards register :func:`timed_hook`: torch's
own default all-reduce of each gradient bucket (the same sum, divided by the world
size), timed from issue to completion. On NCCL the flight recorder times the calls
already (``_timings.collect``), so nothing is registered there.

A hook of the user's own (``ddp.register_comm_hook(state, hook)``, the built-in
ones, or torch's fused optimizers) replaces the default inside the timed one, so it
still runs, still timed; torch allows one hook per model, and the user's call must
not fail because clusterkernel registered first. ``CLUSTERKERNEL_DDP_HOOK=0`` in the
ranks' environment leaves DDP alone. The cost is measured in
``benchmarks/bench_ddp_timing.py`` (BENCHMARKS.md).

Example (a ``%%mpi`` cell on gloo ranks, a dashboard open)::

    ddp = DistributedDataParallel(net)          # nothing else: its buckets are timed
    ddp(x).sum().backward()                      # -> "torch all_reduce" rows, timeline
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

from clusterkernel.torchdist import _import_hooks

MODULE = "torch.nn.parallel.distributed"
_NAN = float("nan")


class _Timed:
    """The state our hook is registered with: the hook it runs (torch's default
    all-reduce until the user registers one) and what each record needs."""

    __slots__ = ("hook", "state", "user", "backend", "size", "recorder")

    def __init__(self, backend: str, size: int, recorder) -> None:
        self.hook = None  # None: torch's default all-reduce
        self.state = None
        self.user = False
        self.backend, self.size, self.recorder = backend, size, recorder


def timed_hook(timed: _Timed, bucket):
    """The registered hook: run the model's hook (torch's default all-reduce unless
    the user gave one) and record its issue-to-completion time as ``torch all_reduce``
    (blocked time: not measured, it overlaps the backward pass)."""
    if timed.hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook, state = allreduce_hook, timed.state
    else:
        hook, state = timed.hook, timed.state
    nbytes = bucket.buffer().nbytes
    start = time.perf_counter()
    fut = hook(state, bucket)
    rec, backend, size = timed.recorder, timed.backend, timed.size

    def done(f):
        rec.timing("torch all_reduce", nbytes, start, time.perf_counter() - start, _NAN,
                   backend, size)  # fmt: skip
        return f.value()

    return fut.then(done)


def _register_ours(ddp) -> None:
    if getattr(ddp, "_ck_timed", None) is not None or getattr(ddp, "reducer", None) is None:
        return
    import torch.distributed as dist

    from clusterkernel import metrics

    group = ddp.process_group
    backend = str(dist.get_backend(group))
    if "nccl" in backend:
        return  # the flight recorder has NCCL's times
    timed = _Timed(backend, group.size(), metrics.recorder())
    # torch's default averages over the model's group (None would be the whole world)
    timed.state = group
    _ORIGINAL["register_comm_hook"](ddp, timed, timed_hook)
    ddp._ck_timed = timed


_ORIGINAL: dict = {}


def _patch(module) -> None:
    """Wrap ``DistributedDataParallel``'s constructor and hook registration (once)."""
    ddp_class = module.DistributedDataParallel
    if getattr(ddp_class, "_ck_watched", False):
        return
    _ORIGINAL.update(
        init=ddp_class.__init__,
        register_comm_hook=ddp_class.register_comm_hook,
        builtin=ddp_class._register_builtin_comm_hook,
    )

    def __init__(self, *args, **kwargs):
        _ORIGINAL["init"](self, *args, **kwargs)
        try:
            _register_ours(self)
        except Exception:  # a model DDP could not hook (no reducer, ...): untimed
            pass

    def register_comm_hook(self, state, hook):
        timed = getattr(self, "_ck_timed", None)
        if timed is None or timed.user:
            return _ORIGINAL["register_comm_hook"](self, state, hook)
        from clusterkernel.torchdist._timings import timed_allreduce_hook

        if hook is not timed_allreduce_hook:  # that one is what runs already
            self._check_comm_hook(hook)
            timed.hook, timed.state = hook, state
            self.logger._set_comm_hook_name(hook.__qualname__)
        timed.user = True

    def _register_builtin_comm_hook(self, comm_hook_type):
        timed = getattr(self, "_ck_timed", None)
        if timed is None or timed.user:
            return _ORIGINAL["builtin"](self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
            timed.hook = default_hooks.fp16_compress_hook
        timed.user = True  # ALLREDUCE: the default, already running

    for name, fn, old in (
        ("__init__", __init__, _ORIGINAL["init"]),
        ("register_comm_hook", register_comm_hook, _ORIGINAL["register_comm_hook"]),
        ("_register_builtin_comm_hook", _register_builtin_comm_hook, _ORIGINAL["builtin"]),
    ):
        fn.__doc__, fn.__wrapped__ = old.__doc__, old
        setattr(ddp_class, name, fn)
    ddp_class._ck_watched = True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch DDP right after torch imports it (the rank imported no torch yet)."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _import_hooks.remove(self)
            _patch(module)

        loader.exec_module = exec_module
        return spec


_WATCHING = False


def watch() -> None:
    """Time every DDP model made on this rank from now on (see the module docstring).

    Example::

        from clusterkernel.torchdist import _ddp
        _ddp.watch()   # what metrics.recorder() does on a rank
    """
    global _WATCHING
    if _WATCHING or os.environ.get("CLUSTERKERNEL_DDP_HOOK", "1") == "0":
        return
    _WATCHING = True
    module = sys.modules.get(MODULE)
    if module is not None:
        _patch(module)
    else:
        _import_hooks.add(_PatchOnImport())
