"""IPython magics: ``%mpi`` (start, stop, status, push, pull, ...) and ``%%mpi``.

The card's top level names ``magics/``; it lives inside the package (client side), because a
top-level import package called ``magics`` would collide with other projects'
modules in site-packages.

Load with ``%load_ext clusterkernel``, or automatically in every IPython session
with ``c.InteractiveShellApp.extensions = ["clusterkernel"]`` in
``ipython_config.py`` (``ipython profile create`` makes one).
"""

from __future__ import annotations

from clusterkernel.client.magics import _completion
from clusterkernel.client.magics._mpi import MPIMagics

__all__ = ["MPIMagics", "load_ipython_extension", "unload_ipython_extension", "current_cluster"]

_magics: MPIMagics | None = None


def load_ipython_extension(ipython) -> None:
    global _magics
    if _magics is None or _magics.shell is not ipython:
        _magics = MPIMagics(ipython)
    ipython.register_magics(_magics)
    _completion.install(ipython, current_cluster)  # Tab in rank cells asks the ranks


def unload_ipython_extension(ipython) -> None:
    global _magics
    _completion.uninstall(ipython)
    if _magics is not None:
        _magics._stop_quietly()
        _magics = None


def current_cluster():
    """The :class:`~clusterkernel.Cluster` that ``%mpi start`` started, or None."""
    return None if _magics is None else _magics.cluster
