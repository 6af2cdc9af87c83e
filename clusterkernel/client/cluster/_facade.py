"""How :class:`~clusterkernel.Cluster` hands a question or a call to the part that owns it.

``Cluster`` is a façade over named parts (``_rankmap.RankMap``, ``_keep_state.Keeping``,
``_dashboard_port.DashboardPort``, ``_cells.Cells``, ``_status.RankStatus``), each held as
a private field of the cluster. :func:`part_property` makes a read-only property of
the cluster that one part answers (``cluster.ranks`` is ``cluster._ranks.ranks``);
:func:`part_method` makes a method of the cluster that one part carries out, given the
cluster first where it needs the public API (``cluster.run(code)`` is
``cluster._cells.run(cluster, code)``). Either way the docstring (the user's docs) and
the signature are the part's, so ``help(Cluster.run)`` shows them, and the part's
fields stay its own: the façade changes them only through the part's methods.

Example::

    class Counter:
        def __init__(self): self._n = 0
        @property
        def n(self):
            "How many."
            return self._n
        def add(self, k: int) -> None:
            "Add ``k``."
            self._n += k

    class Facade:
        def __init__(self): self._counter = Counter()
        n = part_property("_counter", Counter, "n")
        add = part_method("_counter", Counter.add, cluster=False)

    f = Facade(); f.add(2); f.n      # 2
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from inspect import signature
from operator import attrgetter
from typing import Any, cast


def part_property(part: str, cls: type, name: str) -> property:
    """A read-only property that the façade's part ``part`` (a ``cls``) answers as its
    ``name``, with the docstring the part gives it."""
    return property(attrgetter(f"{part}.{name}"), doc=getattr(cls, name).__doc__)


def part_method(part: str, method: Callable, cluster: bool = True) -> Callable:
    """A method that the façade's part ``part`` carries out: the part's ``method``, given
    the façade first (``cluster=False``: not given it). Its docstring and signature (less
    that argument) are ``method``'s."""
    get = attrgetter(part)

    def delegate(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(get(self), *((self,) if cluster else ()), *args, **kwargs)

    functools.update_wrapper(delegate, method)
    delegate.__qualname__ = f"Cluster.{method.__name__}"
    params = list(signature(method).parameters.values())
    del params[1 : 2 if cluster else 1]
    cast(Any, delegate).__signature__ = signature(method).replace(parameters=params)
    return delegate
