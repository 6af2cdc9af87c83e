"""Runs once on every engine right after (re)start (engine side).

Reports the engine's MPI rank, host and pid so the client can build its rank map,
and gives the client two ways to see a rank's Python stack while the rank's main
thread is busy, even blocked inside an MPI call:

- a control-channel request (``clusterkernel_stack_request``), answered by
  ipykernel's control thread. mpi4py releases the GIL inside blocking calls, so
  that thread can read the main thread's frames and their locals. It travels
  through ipyparallel's signed control channel, so it works for ranks on any host;
- ``faulthandler`` on SIGUSR1, written to a file: the fallback for a rank whose
  control thread cannot run (a C extension holding the GIL), local hosts only.

It also arms the debugger (:mod:`clusterkernel.rank._debugger`): ``breakpoint()`` in a
cell, and post-mortem of a failed cell, driven through the same control channel,
and notes the job's /dev/shm file names for the guard (:mod:`clusterkernel.protocol._shm_names`).
"""

from __future__ import annotations

import faulthandler
import functools
import os
import socket
import sys
import threading

from clusterkernel.protocol import _ipykernel, _oom, _shm_names
from clusterkernel.protocol._names import (
    COMPLETE_REPLY,
    COMPLETE_REQUEST,
    GPU_REPLY,
    GPU_REQUEST,
    INSPECT_REPLY,
    INSPECT_REQUEST,
    OURS,
    STACK_REPLY,
    STACK_REQUEST,
    STACK_SIGNAL,
    TORCH_ABORT_REPLY,
    TORCH_ABORT_REQUEST,
    stack_path,
)
from clusterkernel.rank._frames import frame_locals

_stack_file = None
_rank: int | None = None
_warming: threading.Thread | None = None

# Frames of the engine's own machinery, below the cell: dropped from every stack.
_MACHINERY = ("IPython/core/interactiveshell.py",)


def main_thread_frames(with_locals: bool = False) -> list[dict]:
    """The main thread's frames, outermost first, from the cell down.

    Each frame: ``file``, ``line``, ``name``, ``source`` (the line's text),
    ``ours`` (inside clusterkernel) and, with ``with_locals``, ``locals``
    (name -> short repr). Runs on any thread.
    """
    import linecache

    frame = sys._current_frames().get(threading.main_thread().ident)
    frames = []
    while frame is not None:
        code = frame.f_code
        if any(m in code.co_filename for m in _MACHINERY):
            break  # everything further out is IPython running the cell
        entry = {
            "file": code.co_filename,
            "line": frame.f_lineno,
            "name": code.co_name,
            "source": linecache.getline(code.co_filename, frame.f_lineno).strip(),
            "ours": code.co_filename.startswith(OURS),
        }
        if with_locals and not entry["ours"]:
            entry["locals"] = frame_locals(frame)
        frames.append(entry)
        frame = frame.f_back
    frames.reverse()
    return frames


def _on_stack_request(kernel, stream, ident, parent) -> None:
    """Control-thread handler: reply with the main thread's frames."""
    content = parent.get("content", {})
    try:
        frames = main_thread_frames(with_locals=bool(content.get("locals")))
        reply = {"status": "ok", "rank": _rank, "frames": frames, "flight": _flight(frames)}
    except Exception as e:
        reply = {"status": "error", "rank": _rank, "error": f"{type(e).__name__}: {e}"}
    _ipykernel.send_reply(kernel, stream, STACK_REPLY, reply, parent, ident)


def _flight(frames: list[dict]) -> list[dict]:
    """The flight recorders' entries: comm's, and torch.distributed's own, if used."""
    recorder = sys.modules.get("clusterkernel.comm._flight")
    out = recorder.FLIGHT.snapshot() if recorder is not None else []
    if "torch.distributed" in sys.modules:
        from clusterkernel.torchdist._flight import entries, in_torch

        cell = [f for f in frames if not f["ours"] and "site-packages" not in f["file"]]
        where = (cell[-1]["file"], cell[-1]["line"]) if cell else ("", 0)
        out += entries(in_call=in_torch(frames), where=where)
    return out


def _gpu(content: dict) -> dict:
    """This rank's GPU, as ``torchdist._gpu.device_status`` reads it."""
    from clusterkernel.torchdist._gpu import device_status

    return {"gpu": device_status()}


def _torch_abort(content: dict) -> dict:
    """Abort this rank's torch.distributed groups (frees a rank blocked in one)."""
    from clusterkernel.torchdist._group import abort

    return {"aborted": abort()}


def _answering(kernel, reply_type: str, answer):
    """A control-thread handler that replies ``answer(request content)`` (plus status, rank)."""

    def handler(stream, ident, parent) -> None:
        try:
            reply = {"status": "ok", "rank": _rank, **answer(parent.get("content", {}))}
        except Exception as e:
            reply = {"status": "error", "rank": _rank, "error": f"{type(e).__name__}: {e}"}
        _ipykernel.send_reply(kernel, stream, reply_type, reply, parent, ident)

    return handler


def _install_stack_handler() -> None:
    kernel = _ipykernel.kernel_of()
    if kernel is None:
        return
    answer = functools.partial(_ipykernel.answer_control, kernel)
    answer(
        STACK_REQUEST,
        lambda stream, ident, parent: _on_stack_request(kernel, stream, ident, parent),
    )
    answer(TORCH_ABORT_REQUEST, _answering(kernel, TORCH_ABORT_REPLY, _torch_abort))
    answer(GPU_REQUEST, _answering(kernel, GPU_REPLY, _gpu))
    from clusterkernel.rank import _warnings  # warnings name the cell, not a temp file

    _warnings.install(_ipykernel.shell_of(kernel))
    from clusterkernel.rank import _profile_cells  # profiles name each cell: Cell In[7]

    _profile_cells.follow(_ipykernel.shell_of(kernel))
    from clusterkernel.rank import _completion  # Tab and Shift-Tab on rank-side names

    answer(
        COMPLETE_REQUEST,
        _answering(kernel, COMPLETE_REPLY, lambda content: _completion.complete(kernel, content)),
    )
    answer(
        INSPECT_REQUEST,
        _answering(
            kernel, INSPECT_REPLY, lambda content: _completion.inspect_name(kernel, content)
        ),
    )
    from clusterkernel.rank import _debugger  # breakpoint() and post-mortem, same channel

    _debugger.install(kernel)


def _warm_completer() -> None:
    """Rank 0 answers Tab by default: its completer warms up now, beside the rest of the
    start, not in the user's first Tab (which would outlast the client's wait)."""
    global _warming
    kernel = _ipykernel.kernel_of()
    if kernel is None or _warming is not None:
        return
    from clusterkernel.rank import _completion

    def warm() -> None:
        try:
            _completion.warm(kernel)
        except Exception:  # the first Tab then pays for it, as without the warm-up
            pass

    _warming = threading.Thread(target=warm, name="warm completer", daemon=True)
    _warming.start()


def setup(stack_dir: str | None) -> dict:
    """Arm the stack reporters and return this engine's identity."""
    global _stack_file, _rank
    from clusterkernel.rank._world import world as _world

    world = _world()
    rank = _rank = world.Get_rank()
    from clusterkernel.rank import _sync  # a restarted or respawned rank imports what was synced

    # before the completer can run beside this thread (rank 0's warm-up, a Tab), which
    # this edit of sys.path would otherwise wait for
    _sync.restore_path()
    _install_stack_handler()
    if rank == 0:
        _warm_completer()
    from clusterkernel.torchdist._sockets import track  # before any group is made

    track()
    metrics = sys.modules.get("clusterkernel.metrics")
    if metrics is not None:  # imported before the engine started (the warm start)
        metrics._follow_engine_cells()
    if _stack_file is None and stack_dir:
        # Kept open for the engine's life: faulthandler writes to the fd from a
        # signal handler, where opening a file is not allowed. The directory is
        # the client's; on a node that does not share its file system it is
        # missing, and the control-channel request is the only way in.
        try:
            _stack_file = open(stack_path(stack_dir, rank), "w")  # noqa: SIM115
        except OSError:
            _stack_file = None
        else:
            faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    if stack_dir:
        # The job's /dev/shm names, for the guard to remove if mpiexec cannot.
        _shm_names.note(stack_dir, rank)
    return {
        "rank": rank,
        "size": world.Get_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "oom": _oom.counter(),  # read again if this rank dies of SIGKILL
    }
