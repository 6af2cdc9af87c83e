"""ipykernel's internals, touched from this module only (both sides use it).

clusterkernel reaches into the running ipykernel ``Kernel`` where ipykernel has no
public hook: it answers its own control-channel requests on a rank (stacks, the
debugger, completion), keeps JupyterLab's status Busy in the notebook, and answers
Tab in rank cells from the ranks. Each function here is one such touch, its
docstring naming the internal and why; the rest of the package calls these, so an
ipykernel release that moves one is fixed here (as ``client/cluster/_ipp.py`` is for
ipyparallel). ``tests/test_ipykernel_adapter.py`` checks no other module touches them.

It lives in ``protocol/`` because both sides need it (the rank's control handlers and
the notebook's kernel), and like the rest of ``protocol/`` it imports the standard
library only: it works on the kernel object it is given, and finds the running one
through ``sys.modules`` (a process with a kernel has IPython loaded already).

Example::

    kernel = kernel_of()                     # None outside a Jupyter or engine kernel
    if kernel is not None:
        answer_control(kernel, "my_request", handler)  # handler(stream, ident, parent)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, Any, dict], Any]  # (stream, ident, parent): a control handler


def kernel_of(shell: Any = None) -> Any:
    """The ipykernel ``Kernel`` running ``shell`` (default: the running IPython's), or None.

    Touches ``ZMQInteractiveShell.kernel``, where ipykernel's shell keeps its kernel; a
    terminal IPython, or a job under plain ``mpiexec``, has none. IPython is read from
    ``sys.modules``, never imported: where it is not loaded no kernel runs.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    return kernel if hasattr(kernel, "control_handlers") else None


def shell_of(kernel: Any) -> Any:
    """The IPython shell of ``kernel`` (``Kernel.shell``): its namespace and events."""
    return kernel.shell


def control_handler(kernel: Any, msg_type: str) -> Handler | None:
    """The handler ``kernel`` runs for control message ``msg_type``, or None.

    Touches ``Kernel.control_handlers``, ipykernel's dispatch table for the control
    channel (read here to wrap its subshell requests, see ``dashboard/_busy.py``).
    """
    return kernel.control_handlers.get(msg_type)


def answer_control(kernel: Any, msg_type: str, handler: Handler) -> None:
    """Run ``handler(stream, ident, parent)`` on the control thread for ``msg_type``.

    Touches ``Kernel.control_handlers``: ipykernel has no public way to add a message
    type, and the control thread is the one that answers while a cell runs or waits in
    MPI (stacks, the debugger, completion, torch aborts on a rank).
    """
    kernel.control_handlers[msg_type] = handler


def send_reply(kernel: Any, stream: Any, msg_type: str, content: dict, parent: dict, ident) -> None:
    """Send the reply ``msg_type`` to the control request ``parent`` on ``stream``.

    Touches ``Kernel.session``, the signed session ipykernel sends its own replies
    with: a reply signed otherwise is dropped by the client.
    """
    kernel.session.send(stream, msg_type, content, parent, ident)


def on_control_thread(stream: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on the thread that serves ``stream`` (thread-safe).

    Touches the control stream's ``io_loop``: a reply must be sent from the control
    thread, and a rank's pdb answers on its main thread.
    """
    stream.io_loop.add_callback(fn, *args)


def later_on_control_thread(stream: Any, seconds: float, fn: Callable[[], Any]) -> None:
    """Run ``fn()`` on ``stream``'s thread after ``seconds`` (``io_loop.call_later``):
    a command's deadline, answered "running" if pdb has not answered by then."""
    stream.io_loop.call_later(seconds, fn)


def running_request(kernel: Any) -> dict:
    """The shell-channel request ``kernel`` is serving now (``{}`` when none).

    Touches ``Kernel.get_parent("shell")``: the running cell's ``execute_request``,
    its header and metadata (``%%mpi``'s cell label), which IPython does not expose.
    """
    return kernel.get_parent("shell") or {}


def publish_busy(kernel: Any, parent: dict) -> None:
    """Publish a ``busy`` status on IOPub for the request ``parent``.

    Touches ``Kernel._publish_status``: the only way to say Busy for a running cell
    after a control request's ``idle`` (JupyterLab shows Idle on it; see
    ``dashboard/_busy.py``).
    """
    kernel._publish_status("busy", "shell", parent=parent)


def completion_methods(kernel: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``kernel``'s ``(do_complete, do_inspect)``: what answers Tab and Shift-Tab."""
    return kernel.do_complete, kernel.do_inspect


def set_completion_methods(kernel: Any, complete: Callable[..., Any], inspect: Callable) -> None:
    """Make ``kernel`` answer ``complete_request`` / ``inspect_request`` with these.

    Touches ``Kernel.do_complete`` / ``do_inspect`` on the instance: ipykernel has no
    hook for its replies, so the notebook's kernel answers rank cells from the ranks
    (``magics/_completion.py``) and puts its own methods back with this too.
    """
    kernel.do_complete = complete
    kernel.do_inspect = inspect


def complete(kernel: Any, code: str, cursor_pos: int) -> Any:
    """``kernel``'s own ``complete_reply`` content (``Kernel.do_complete``): a rank
    answers Tab exactly as ipykernel does in an ordinary notebook."""
    return kernel.do_complete(code, cursor_pos)


def inspect(kernel: Any, code: str, cursor_pos: int, detail_level: int, omit: tuple) -> Any:
    """``kernel``'s own ``inspect_reply`` content (``Kernel.do_inspect``): Shift-Tab."""
    return kernel.do_inspect(code, cursor_pos, detail_level, omit)


def before_shutdown(kernel: Any, fn: Callable[[], Any]) -> None:
    """Run ``fn`` when ``kernel`` shuts down or restarts, before ipykernel closes its
    sockets.

    Wraps the instance's ``do_shutdown`` (ipykernel's step of a ``shutdown_request``, on
    the control thread): ipykernel has no public hook there, and by the time the
    interpreter exits its sockets are closed.
    """
    original = kernel.do_shutdown

    def do_shutdown(restart: bool) -> Any:
        fn()
        return original(restart)

    kernel.do_shutdown = do_shutdown
