"""``%mpi start``'s progress, shown in place in any frontend and gone when the start ends.

In a Jupyter kernel (notebook, JupyterLab, the MPI kernel) the line is one display
whose content is replaced (``display_id``, ``update_display_data``); in a terminal
IPython it is a line rewritten with ``\\r``. Either way it is removed at the end,
so the cell keeps only ``Started 4 MPI ranks``. It is the ``progress`` callback that
the magic passes to :meth:`~clusterkernel.Cluster.start`.

Example::

    # not run: a start of its own; %mpi start does this
    cluster.start(progress=LiveLine(get_ipython()))
"""

from __future__ import annotations

import sys
from typing import Any


class LiveLine:
    """A status line shown in place: ``line("2 of 4 registered")`` shows or replaces it,
    ``line(None)`` removes it. ``shell``: the IPython shell (a kernel's has ``kernel``).

    Example::

        line = LiveLine(get_ipython())
        line("Starting 4 MPI ranks: 2 of 4 registered")
        line(None)                     # gone
    """

    def __init__(self, shell: Any) -> None:
        self.in_kernel = getattr(shell, "kernel", None) is not None
        self._handle: Any = None  # the display, in a kernel
        self._width = 0  # the terminal line's length

    def __call__(self, text: str | None) -> None:
        if self.in_kernel:
            self._display(text)
        else:
            self._terminal(text)

    def _display(self, text: str | None) -> None:
        from IPython.display import display

        if text is None:
            if self._handle is not None:
                self._handle.update({"text/plain": ""}, raw=True)
                self._handle = None
            return
        if self._handle is None:
            self._handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self._handle.update({"text/plain": text}, raw=True)

    def _terminal(self, text: str | None) -> None:
        if text is None and not self._width:
            return
        line = text or ""
        end = "\r" if text is None else ""
        sys.stdout.write(f"\r{line}{' ' * max(0, self._width - len(line))}{end}")
        sys.stdout.flush()
        self._width = len(line)
