"""Completion and inspection of the rank's own names (engine side).

The client asks through the engine's control channel (see ``_engine_setup``), so
a rank answers while its main thread runs a long cell or waits in MPI. The answer
is the engine kernel's own ``do_complete`` / ``do_inspect``: IPython's completer
(jedi, dict keys, paths, attribute completion with IPython's "limited" evaluation,
which runs nothing with side effects) and IPython's inspector (``obj?`` / ``obj??``)
on this rank's namespace, exactly what ipykernel answers in an ordinary notebook.
"""

from __future__ import annotations

import inspect

from clusterkernel.protocol import _ipykernel

# the most top-level names sent back for the client's cache (a namespace can be huge)
MAX_NAMES = 5000


def _settled(reply):
    if inspect.isawaitable(reply):  # an async do_* of a future ipykernel: not on this thread
        reply.close()
        raise RuntimeError("the engine's kernel completes asynchronously")
    return reply


def names(shell) -> list[str]:
    """The user's top-level names on this rank (IPython's hidden ones and ``_x`` left out)."""
    hidden = shell.user_ns_hidden
    visible = [k for k in shell.user_ns if not k.startswith("_") and k not in hidden]
    return sorted(visible)[:MAX_NAMES]


def complete(kernel, content: dict) -> dict:
    """``{"reply": <complete_reply content>, "names": [...]}`` for ``content``'s code
    (only ``names`` when ``content["names_only"]``: the client's cache after a cell)."""
    if content.get("names_only"):
        return {"names": names(_ipykernel.shell_of(kernel))}
    code = content.get("code", "")
    reply = _settled(_ipykernel.complete(kernel, code, content.get("cursor_pos", len(code))))
    return {"reply": reply, "names": names(_ipykernel.shell_of(kernel))}


def inspect_name(kernel, content: dict) -> dict:
    """``{"reply": <inspect_reply content>}`` for the name at the cursor in ``content``'s code."""
    code = content.get("code", "")
    reply = _ipykernel.inspect(
        kernel,
        code,
        content.get("cursor_pos", len(code)),
        content.get("detail_level", 0),
        tuple(content.get("omit_sections", ())),
    )
    return {"reply": _settled(reply)}
