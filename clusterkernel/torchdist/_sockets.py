"""The TCP connections of this rank's torch.distributed groups, and closing them (rank side).

gloo frees a group's connections only when the last reference to the group goes,
and a DDP or FSDP model, a device mesh or torch's DTensor caches hold one, so
aborting a group (``_abort_process_group``) does not free a rank blocked in one of
its collectives while a model lives. Shutting the group's sockets down does, whatever
holds the group: the blocked call raises "Connection closed by peer" at once, on
this rank and on the peers at the other end (measured on torch 2.13, DDP and a plain
``all_reduce``; the listening socket must be left open, shutting it down makes
gloo's listener thread abort the process).

Which sockets are a group's: the ones that appear while torch makes a group
(``distributed_c10d._new_process_group_helper``, where every path to a new group
goes: ``init_process_group``, ``new_group``, ``init_device_mesh``); gloo connects a
group's full mesh there. :func:`track` wraps that function once per process, at
once if torch.distributed is loaded, else when it is first imported.

Example (the engine calls :func:`track` at start; the hang report calls :func:`cut`
from the control thread)::

    track()
    ...                      # the user's cells make groups, DDP models
    cut()                    # -> 2: connections shut down, blocked calls raise
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import socket
import sys
import threading

from clusterkernel.torchdist import _import_hooks, _subgroups

_C10D = "torch.distributed.distributed_c10d"
_HELPER = "_new_process_group_helper"

_lock = threading.Lock()
_inodes: set[int] = set()  # socket inodes made while torch made a group
_wrapped = False


def _socket_fds() -> dict[int, int]:
    """``{socket inode: fd}`` of this process."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        if link.startswith("socket:["):
            out[int(link[8:-1])] = int(fd)
    return out


def _wrap(c10d) -> None:
    global _wrapped
    _subgroups.watch(c10d)  # the same moment: every group the user makes is recorded too
    with _lock:
        if _wrapped or not hasattr(c10d, _HELPER):
            return
        made = getattr(c10d, _HELPER)

        def helper(*args, **kwargs):
            before = set(_socket_fds())
            try:
                return made(*args, **kwargs)
            finally:
                with _lock:
                    _inodes.update(set(_socket_fds()) - before)

        helper.__wrapped__ = made  # type: ignore[attr-defined]
        setattr(c10d, _HELPER, helper)
        _wrapped = True


class _OnImport(importlib.abc.MetaPathFinder):
    """Wraps the group maker when torch.distributed is first imported."""

    def find_spec(self, name, path, target=None):
        if name != _C10D:
            return None
        _import_hooks.remove(self)  # once: the finders after it find the module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def track() -> None:
    """Record the sockets of every torch.distributed group made in this process from now on,
    and each ``new_group`` call (:func:`clusterkernel.torchdist._subgroups.watch`).

    Idempotent. Where torch.distributed is being imported by another thread (the
    engine's pre-import), waits for that import to finish first.
    """
    if _wrapped:
        return
    if "torch.distributed" in sys.modules or _C10D in sys.modules:
        _wrap(importlib.import_module(_C10D))
    elif not any(isinstance(f, _OnImport) for f in sys.meta_path):
        _import_hooks.add(_OnImport())


def cut() -> int:
    """Shut down the connections of this rank's torch.distributed groups; how many.

    Safe from any thread. A collective blocked on one of them raises at once, here
    and on the peer; the groups are unusable afterwards (make new ones:
    ``torchdist.reinit()``). Listening sockets are left open (see the module's note).
    """
    fds = _socket_fds()
    done = 0
    with _lock:
        _inodes.intersection_update(fds)
        inodes = list(_inodes)
    for inode in inodes:
        try:
            sock = socket.socket(fileno=os.dup(fds[inode]))
        except OSError:  # closed meanwhile
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:  # not connected (any more): nothing to close
            pass
        finally:
            sock.close()  # the duplicate only; torch's own fd stays
    return done
