"""The control-channel requests the notebook pulls a rank's profile through (rank side).

Part of the rank's sampler (``rank/_profile.py``). ipykernel's control thread answers
these while the cell keeps the main thread busy: :data:`PROFILE_REQUEST` stops the
sampler and replies with the profile (a hung cell under ``--timeout``), and
:data:`PROFILE_PEEK` replies with the rolling window and new snapshots, the sampler
left running (the dashboard's profile panel, ``%mpi profile start --every 60s``). The
notebook sends them by these names (``client/profile/_collect.py``, ``_live.py``).

Why pull on the control channel rather than push on the dashboard's metric stream: the
stream exists only while a dashboard is open, and ``cluster.profile("snapshots")`` must
work from a script without one; a queued ``rank_call`` would wait for the cell to end;
and the rank cuts its windows itself, so their edges do not depend on when the
notebook asks (a notebook busy for a minute loses nothing, its next pull takes every
snapshot since).

ipykernel's handler table and session are reached through ``protocol/_ipykernel.py``.

Example::

    install(stop, peek)   # on an engine: the control thread now answers both requests
"""

from __future__ import annotations

from collections.abc import Callable

from clusterkernel.protocol import _ipykernel

# PROFILE_REQUEST: answered by ipykernel's control thread while the cell still runs (a
# hang under --timeout), so what was sampled comes back before the rank is freed or
# restarted. PROFILE_PEEK (content: peek's keywords) leaves the sampler running.
from clusterkernel.protocol._names import (
    PEEK_REPLY,
    PROFILE_PEEK,
    PROFILE_REPLY,
    PROFILE_REQUEST,
)


def install(stop: Callable[[], dict | None], peek: Callable[..., dict]) -> None:
    """Answer :data:`PROFILE_REQUEST` with ``stop()`` and :data:`PROFILE_PEEK` with
    ``peek(window, since)`` on this engine's control thread (once; nothing where no
    kernel runs: an exported batch job).

    Example::

        install(_profile.stop, _profile.peek)
    """
    # an engine has IPython loaded already; an exported batch job has none to load
    kernel = _ipykernel.kernel_of()
    if kernel is None or _ipykernel.control_handler(kernel, PROFILE_PEEK) is not None:
        return

    def answer(stream, ident, parent) -> None:
        try:
            reply = {"status": "ok", "profile": stop()}
        except Exception as e:  # reply anyway: the notebook waits for it
            reply = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        _ipykernel.send_reply(kernel, stream, PROFILE_REPLY, reply, parent, ident)

    def answer_peek(stream, ident, parent) -> None:
        content = parent.get("content") or {}
        try:
            reply = {"status": "ok", **peek(content.get("window"), content.get("since", -1))}
        except Exception as e:  # reply anyway: the notebook's poller waits for it
            reply = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        _ipykernel.send_reply(kernel, stream, PEEK_REPLY, reply, parent, ident)

    _ipykernel.answer_control(kernel, PROFILE_REQUEST, answer)
    _ipykernel.answer_control(kernel, PROFILE_PEEK, answer_peek)
