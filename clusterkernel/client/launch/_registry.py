"""The launchers by kind: ``"mpiexec"`` and each scheduler's name (client side).

A launcher class registers itself for its kinds when its module is imported
(:mod:`clusterkernel.client.launch` imports them all): ``_mpiexec`` for ``"mpiexec"``,
``_batch_job`` for every scheduler of :mod:`clusterkernel.client.scheduler`. The
settings build a launcher through :func:`launcher_class` and never import a launcher,
so no launcher module imports back what imports it.

Example::

    from clusterkernel.client.launch import launcher_class
    launcher_class("mpiexec").__name__     # 'MpiexecLauncher'
    launcher_class("sge").__name__         # 'BatchLauncher'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterkernel.client.launch._protocol import Launcher
    from clusterkernel.client.launch._settings import LaunchSettings

    LauncherClass = Callable[[LaunchSettings], Launcher]

_LAUNCHERS: dict[str, LauncherClass] = {}


def register(kind: str, launcher: LauncherClass) -> None:
    """Build the launchers of ``kind`` with ``launcher`` (a class taking the settings)."""
    _LAUNCHERS[kind] = launcher


def launcher_class(kind: str) -> LauncherClass:
    """The class that builds the launchers of ``kind``."""
    try:
        return _LAUNCHERS[kind]
    except KeyError:
        raise ValueError(
            f"No launcher for {kind!r}; the launchers are {', '.join(sorted(_LAUNCHERS))}."
        ) from None
