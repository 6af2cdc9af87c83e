"""Completion and inspection of the rank's own names (engine side).

The client asks through the engine's control channel (see ``_engine_setup``), so
a rank answers while its main thread runs a long cell or waits in MPI. The answer
is the engine kernel's own ``do_complete`` / ``do_inspect``: IPython's completer
(jedi, dict keys, paths, attribute completion with IPython's "limited" evaluation,
which runs nothing with side effects) and IPython's inspector (``obj?`` / ``obj??``)
on this rank's namespace, exactly what ipykernel answers in an ordinary notebook.

A rank's first completion is slow (jedi parses the builtins' stubs, IPython's
completer sizes up the namespace): longer than the client waits for a Tab. Rank 0,
the one that answers by default, pays it while it starts: :func:`load_jedi` beside the
engine's own start (``_warm_start``), :func:`warm` once its kernel exists
(``_engine_setup``). One lock keeps the completer to one thread at a time, so a Tab
that comes during a warm-up waits for it instead of doing the same work beside it.

The completer runs beside the main thread, and jedi, looking a module up, swaps
``sys.path`` for a list of its own and puts the old list back after: an edit of
``sys.path`` made on the main thread meanwhile lands in jedi's list and is gone. The
rank's own path edits (the synced files first, ``_sync``) wait for the completer
(:func:`completer_still`); a user's cell that edits ``sys.path`` while a Tab is answered
is not covered.

Example::

    warm(kernel)                                      # rank 0, at set-up
    complete(kernel, {"code": "torch.zer"})["reply"]["matches"]
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator

from clusterkernel.protocol import _ipykernel

# the most top-level names sent back for the client's cache (a namespace can be huge)
MAX_NAMES = 5000
# what a warm-up completes: an attribute of a builtin (jedi loads the builtins' stubs)
# and a top-level name (the completer reads the namespace); nothing of the user's is run
_WARM_CODES = ("str.jo", "pri")
# jedi and IPython's completer are not thread-safe: the control thread's answers and the
# warm-ups take turns; so do the rank's own edits of sys.path (see completer_still)
_lock = threading.Lock()


def _settled(reply):
    if inspect.isawaitable(reply):  # an async do_* of a future ipykernel: not on this thread
        reply.close()
        raise RuntimeError("the engine's kernel completes asynchronously")
    return reply


@contextlib.contextmanager
def completer_still() -> Iterator[None]:
    """Hold this rank's completer (a Tab being answered, a warm-up) off while the block
    runs: jedi swaps ``sys.path`` while it looks a module up, so an edit of ``sys.path``
    made beside it would be lost. Waits for a completion in progress.

    Example::

        with completer_still():
            sys.path.insert(0, directory)
    """
    with _lock:
        yield


def names(shell) -> list[str]:
    """The user's top-level names on this rank (IPython's hidden ones and ``_x`` left out)."""
    hidden = shell.user_ns_hidden
    visible = [k for k in shell.user_ns if not k.startswith("_") and k not in hidden]
    return sorted(visible)[:MAX_NAMES]


def load_jedi() -> None:
    """Load jedi and parse the builtins' stubs, the larger part of a first completion;
    needs no kernel, so it runs while the engine starts."""
    import jedi

    with _lock:
        jedi.Interpreter(_WARM_CODES[0], [{}]).complete()


def warm(kernel) -> None:
    """Complete once through ``kernel``'s own completer, so that the first Tab is
    answered as fast as every later one."""
    with _lock:
        for code in _WARM_CODES:
            _settled(_ipykernel.complete(kernel, code, len(code)))


def complete(kernel, content: dict) -> dict:
    """``{"reply": <complete_reply content>, "names": [...]}`` for ``content``'s code
    (only ``names`` when ``content["names_only"]``: the client's cache after a cell)."""
    if content.get("names_only"):
        return {"names": names(_ipykernel.shell_of(kernel))}
    code = content.get("code", "")
    with _lock:
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
