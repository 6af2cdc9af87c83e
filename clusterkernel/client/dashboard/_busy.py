"""Keep JupyterLab's kernel status at Busy while a cell that showed the dashboard runs.

Why: JupyterLab 4.6 sends the comms of a widget over a kernel subshell. The first
widget comm of a kernel (and the last one closing) makes it send a
``create_subshell_request`` (``delete_subshell_request``) on the control channel;
ipykernel answers with ``busy`` then ``idle`` status messages whose parent is that
request, and JupyterLab shows the kernel as Idle on any ``idle`` it does not list as
untracked, although the cell that displayed the widgets (``%%mpi --dashboard``)
still runs. A plain ``%%mpi`` cell opens no comm, so it stayed Busy.

The fix: while the cell that displayed the dashboard runs, every such control
request is followed by a ``busy`` status for that cell, published after the
request's own ``idle``. Nothing is sent outside a running cell, and never after
the cell's own ``idle`` (the cell's end disarms the guard first, under a lock).
"""

from __future__ import annotations

import asyncio
import functools
import threading

from clusterkernel.protocol import _ipykernel

# The control requests JupyterLab sends for comms over subshells.
_SUBSHELL_REQUESTS = ("create_subshell_request", "delete_subshell_request")


class _CellBusyGuard:
    """Re-asserts ``busy`` for the running cell after a subshell control request."""

    def __init__(self, kernel, shell) -> None:
        self.kernel = kernel
        self.shell = shell
        self.parent: dict | None = None  # the running cell's execute_request
        self.lock = threading.Lock()
        for msg_type in _SUBSHELL_REQUESTS:
            handler = _ipykernel.control_handler(kernel, msg_type)
            if handler is not None:
                _ipykernel.answer_control(kernel, msg_type, self._wrap(handler))
        shell.events.register("post_run_cell", self._cell_ended)

    def arm(self) -> None:
        """Called on the main thread while a cell runs: guard this cell."""
        parent = _ipykernel.running_request(self.kernel)
        with self.lock:
            if parent.get("header", {}).get("msg_type") == "execute_request":
                self.parent = parent

    def _cell_ended(self, result=None) -> None:
        # post_run_cell runs before ipykernel publishes the cell's idle
        with self.lock:
            self.parent = None

    def _wrap(self, handler):
        @functools.wraps(handler)
        async def wrapped(*args, **kwargs):
            result = handler(*args, **kwargs)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            # ipykernel publishes the request's idle right after this returns,
            # with no await in between: a callback scheduled now runs after it.
            asyncio.get_running_loop().call_soon(self._reassert)
            return result

        return wrapped

    def _reassert(self) -> None:
        with self.lock:
            if self.parent is not None:
                _ipykernel.publish_busy(self.kernel, self.parent)


_GUARD: _CellBusyGuard | None = None


def keep_cell_busy() -> None:
    """In a Jupyter kernel, keep its status Busy until the current cell ends.

    Called when the dashboard is displayed (its widgets open comms). Does nothing
    outside a Jupyter kernel.

    Example::

        keep_cell_busy()   # in _ipython_display_, before display(widget)
    """
    global _GUARD
    kernel = _ipykernel.kernel_of()
    if kernel is None:
        return
    if _GUARD is None or _GUARD.kernel is not kernel:
        _GUARD = _CellBusyGuard(kernel, _ipykernel.shell_of(kernel))
    _GUARD.arm()
