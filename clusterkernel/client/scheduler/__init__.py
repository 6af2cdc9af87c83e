"""Batch schedulers, one class each: Slurm, Grid Engine (client side).

Every module of this package but ``_system`` holds one :class:`BatchSystem` subclass;
they are found here by walking the package, so a scheduler added later (PBS, LSF,
Flux) is one module, ``_pbs.py``, plus its tests: ``Cluster(launcher="pbs", ...)``,
``%mpi start --scheduler pbs`` with its options, ``%mpi export --qsub``-like export,
the guard's cleanup and keep/attach all read it from its class.

Example::

    from clusterkernel.client import scheduler
    sorted(scheduler.schedulers())                     # ['sge', 'slurm']
    scheduler.get("sge").title                         # 'Grid Engine'
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

from clusterkernel.client.scheduler._system import (
    DEFAULT_TIME,
    BatchSystem,
    CommandHost,
    SchedulerError,
    SchedulerOption,
)

__all__ = [
    "DEFAULT_TIME",
    "BatchSystem",
    "CommandHost",
    "SchedulerError",
    "SchedulerOption",
    "get",
    "schedulers",
    "options",
]


@cache
def schedulers() -> dict[str, type[BatchSystem]]:
    """Every scheduler of this package, by name."""
    found: dict[str, type[BatchSystem]] = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        if info.name.endswith("._system"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BatchSystem)
                and value.name
                and value.__module__ == module.__name__
            ):
                found[value.name] = value
    return dict(sorted(found.items()))


def get(name: str) -> type[BatchSystem]:
    """The scheduler called ``name``; a ValueError lists the known ones."""
    try:
        return schedulers()[name]
    except KeyError:
        raise ValueError(f"no scheduler {name!r}: one of {', '.join(schedulers())}") from None


def options() -> dict[str, list[tuple[type[BatchSystem], SchedulerOption]]]:
    """Each option name, with the schedulers that declare it (several may: ``time``)."""
    out: dict[str, list[tuple[type[BatchSystem], SchedulerOption]]] = {}
    for system in schedulers().values():
        for option in system.options:
            out.setdefault(option.name, []).append((system, option))
    return out


def arguments(where: str) -> list[tuple[str, dict]]:
    """``(flag, argparse keywords)`` of each option offered ``where`` (``"magic"``: ``%mpi
    start``; ``"export"``: ``%mpi export`` and ``clusterkernel export``), once however
    many schedulers take it (``--time``), its help naming them.

    Example::

        dict(arguments("export"))["--time"]["help"]   # 'Grid Engine, Slurm: time limit ...'
    """
    out = []
    for name, owners in options().items():
        offered = [(system, option) for system, option in owners if getattr(option, where)]
        if not offered:
            continue
        option = offered[0][1]
        titles = ", ".join(system.title for system, _ in offered)
        keywords: dict[str, Any] = {"help": f"{titles}: {option.help}", "dest": name}
        if option.type is not str:
            keywords["type"] = option.type
        default = option.export_default if where == "export" else option.default
        if default is not None:
            keywords["default"] = default
        out.append((option.flag, keywords))
    return out
