"""How a cluster's ranks are launched (client side): one settings object, the launchers.

``%mpi start``, ``Cluster(...)`` and the attach of a kept cluster make one
:class:`LaunchSettings` (``_settings``: every launch option, ``n`` among them, checked
once); its :meth:`~LaunchSettings.build` asks the registry (``_registry``: the launcher
class by kind) for the launcher, which keeps the settings with the rank count it starts.
The modules, one job each:

- ``_settings``: :class:`LaunchSettings`, and ``launcher_for`` (``Cluster(launcher=...)``);
- ``_protocol``: the :class:`Launcher` protocol ``Cluster`` drives;
- ``_registry``: the launchers by kind (``"mpiexec"``, ``"slurm"``, ``"sge"``);
- ``_mpiexec``: :class:`MpiexecLauncher`, ``mpiexec`` here or on a host list;
- ``_batch_job``: :class:`BatchLauncher`, a job (or job step) of a scheduler
  (:mod:`clusterkernel.client.scheduler` holds the schedulers themselves);
- ``_engine_set``: what every launcher does with ipyparallel's engine set (base
  configuration, engine command, output);
- ``_run_dir``: a cluster's private directory; ``_guard``: the process that stops the
  cluster if the notebook dies; ``_engine_wait``: the wait for ``n`` fresh engines.

``clusterkernel.client.cluster._lifecycle.Engines`` uses them to start, restart and stop
a running cluster's processes.

Example::

    from clusterkernel.client.launch import LaunchSettings
    launcher = LaunchSettings(n=2).build()
    launcher.kind, launcher.settings.n     # ('mpiexec', 2)
"""

from __future__ import annotations

from clusterkernel.client.launch import _batch_job, _mpiexec  # noqa: F401  (they register)
from clusterkernel.client.launch._batch_job import BatchLauncher
from clusterkernel.client.launch._mpiexec import MpiexecLauncher
from clusterkernel.client.launch._protocol import Launcher
from clusterkernel.client.launch._registry import launcher_class, register
from clusterkernel.client.launch._settings import LaunchSettings, launcher_for

__all__ = [
    "LaunchSettings",
    "Launcher",
    "MpiexecLauncher",
    "BatchLauncher",
    "launcher_class",
    "launcher_for",
    "register",
]
