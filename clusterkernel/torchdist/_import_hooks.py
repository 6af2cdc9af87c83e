"""Adding and removing this package's import hooks (``sys.meta_path`` finders) while
other threads import.

CPython's import walks the live ``sys.meta_path`` list, letting go of the import lock
between two finders. A finder removed from that list in place while another thread is
between two of them shifts the list under its walk, and that thread skips a finder:
where the skipped one is the ``PathFinder``, its import fails with
``ModuleNotFoundError`` for a module that is there (a rank's cell importing the user's
module while the engine's background thread imports torch and a hook takes itself
out). A new list each time leaves every walk on the list it began with.

Example::

    from clusterkernel.torchdist import _import_hooks
    _import_hooks.add(finder)      # first in sys.meta_path
    _import_hooks.remove(finder)   # gone; an import walking the old list is unaffected
"""

from __future__ import annotations

import sys
from typing import Any


def add(finder: Any) -> None:
    """Put ``finder`` first in ``sys.meta_path`` (a new list: see the module)."""
    sys.meta_path = [finder, *sys.meta_path]


def remove(finder: Any) -> None:
    """Take ``finder`` out of ``sys.meta_path``, if it is there (a new list: see the module)."""
    sys.meta_path = [f for f in sys.meta_path if f is not finder]
