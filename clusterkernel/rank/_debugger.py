"""A pdb on each rank, driven one command at a time from the notebook (engine side).

Two ways into a rank, both through one control-channel message
(``clusterkernel_debug_request``) that ipykernel's control thread answers, so they
work for ranks on any host and never need the rank's stdin:

- post-mortem: after a cell raised, a :class:`RankPdb` over the rank's last
  traceback runs each command on the control thread (the main thread is idle or
  busy with something else; the frames are finished and only read);
- breakpoints: ``breakpoint()`` in a cell (the hook :func:`install` sets) stops the
  main thread in a :class:`RankPdb` whose stdin is a :class:`_Pipe`. The control
  thread hands it a command and replies with the command's output once pdb asks
  for the next one (or the rank runs on). Each new stop is announced on IOPub
  with ipyparallel's ``publish_data`` (key :data:`PAUSE_KEY`), so the client's
  cell runner learns about it without polling the ranks.

pdb evaluates what the user types (``p expr``) in the rank's frames: the user's own
code on their own ranks, as a cell is.

Example (what the client side sends; see :mod:`clusterkernel.client.debug`)::

    {"op": "command", "session": "ab12", "kind": "post-mortem", "command": "p x"}
    -> {"status": "ok", "kind": "post-mortem", "output": "10\\n", "paused": False}
"""

from __future__ import annotations

import io
import pdb
import queue
import re
import sys
import threading
from collections import OrderedDict

from clusterkernel.protocol import _ipykernel
from clusterkernel.protocol._names import DEBUG_REPLY, DEBUG_REQUEST, PAUSE_KEY
from clusterkernel.rank._frames import frame_locals

# Frames of the engine running a cell (IPython's exec and everything outside it).
_MACHINERY = ("IPython/core/interactiveshell.py",)
_CELL_FILE = re.compile(r"/\S*ipykernel_\d+/\d+\.py")
# Commands that make a finished (post-mortem) frame run again: not possible.
_RESUMING = {"c", "cont", "continue", "n", "next", "s", "step", "r", "return", "unt", "until"}
_RESUMING |= {"j", "jump", "run", "restart", "debug"}
_QUIT = {"q", "quit", "exit"}
_MAX_SESSIONS = 8  # post-mortem debuggers kept per rank (a client may never close one)


def _is_cell_module(frame) -> bool:
    return frame.f_code.co_name == "<module>" and bool(_CELL_FILE.search(frame.f_code.co_filename))


def _under_cell(frame) -> bool:
    while frame is not None:
        if _CELL_FILE.search(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


class RankPdb(pdb.Pdb):
    """pdb as a user of the cell wants it: the cell's frames only, cell files named
    ``cell``, and a ``locals`` command (the current frame's locals, short reprs)."""

    def __init__(self, stdin, stdout) -> None:
        # nosigint: SIGINT belongs to the engine (and may run on the control thread)
        super().__init__(stdin=stdin, stdout=stdout, nosigint=True, readrc=False)

    def stop_here(self, frame) -> bool:
        # Step only through the cell and what it calls, never into IPython running it.
        return super().stop_here(frame) and _under_cell(frame)

    # IPython runs each top-level statement of a cell as its own code: stepping off
    # one goes on to the next statement's first line (or the cell ends), without a
    # "--Return--" and a "--Call--" stop in between.
    def user_call(self, frame, argument_list) -> None:
        if not _is_cell_module(frame):
            super().user_call(frame, argument_list)

    def user_return(self, frame, return_value) -> None:
        if not _is_cell_module(frame):
            super().user_return(frame, return_value)

    def user_exception(self, frame, exc_info) -> None:
        super().user_exception(frame, exc_info)
        if _is_cell_module(frame):  # a cell's locals are the rank's globals: keep them clean
            frame.f_locals.pop("__exception__", None)

    def get_stack(self, f, t):
        stack, i = super().get_stack(f, t)
        cut = 0
        for k, (frame, _) in enumerate(stack[: i + 1]):
            if any(m in frame.f_code.co_filename for m in _MACHINERY):
                cut = k + 1  # IPython's exec of the cell and everything outside it
        if cut > i:  # stopped inside the machinery itself: show it all
            return stack, i
        return stack[cut:], i - cut

    def format_stack_entry(self, frame_lineno, lprefix=": "):
        return _CELL_FILE.sub("cell", super().format_stack_entry(frame_lineno, lprefix))

    def do_locals(self, arg) -> None:
        """locals
        Print the current frame's local variables (a cell's: the rank's variables)."""
        names = frame_locals(self.curframe)
        width = max((len(k) for k in names), default=0)
        for k in sorted(names):
            self.message(f"{k:<{width}} = {names[k]}")


# ---------------------------------------------------------------- post-mortem
_sessions: OrderedDict[str, tuple[RankPdb, io.StringIO]] = OrderedDict()


def _last_traceback():
    exc = getattr(sys, "last_exc", None)  # Python 3.12+
    tb = exc.__traceback__ if exc is not None else getattr(sys, "last_traceback", None)
    return tb


def last_error() -> str | None:
    """``"ZeroDivisionError: division by zero"`` of the rank's last failed cell, or None."""
    value = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if value is None or _last_traceback() is None:
        return None
    return f"{type(value).__name__}: {value}".strip()


def _post_mortem(session: str, command: str) -> dict:
    word = command.strip().split(" ", 1)[0]
    if word in _QUIT:
        _sessions.pop(session, None)
        return {"output": "(post-mortem closed)\n"}
    if word in _RESUMING:
        return {
            "output": f"*** {word}: the cell has already ended; post-mortem can only look "
            "(where, up, down, p, pp, list, args, locals).\n"
        }
    if session not in _sessions:
        tb = _last_traceback()
        if tb is None:
            return {"error": "no_traceback"}
        out = io.StringIO()
        debugger = RankPdb(stdin=io.StringIO(), stdout=out)
        debugger.reset()
        debugger.setup(None, tb)
        _sessions[session] = (debugger, out)
        while len(_sessions) > _MAX_SESSIONS:
            _sessions.popitem(last=False)
    debugger, out = _sessions[session]
    out.seek(0)
    out.truncate()
    debugger.onecmd(command)
    return {"output": out.getvalue()}


# ---------------------------------------------------------------- breakpoints
class _Command:
    """One command from the client and how to answer it (on the control thread)."""

    def __init__(self, text: str, answer) -> None:
        self.text = text
        self.answer = answer  # answer(output, paused) -> None, thread-safe; None: no reply
        self.expired = False


class _Pipe:
    """stdin and stdout of a paused rank's pdb: commands in, their output out."""

    def __init__(self) -> None:
        self.commands: queue.Queue[_Command] = queue.Queue()
        self.out = io.StringIO()
        self.waiting = False  # the main thread waits for a command
        self.seq = 0  # stops announced so far
        self.pending: _Command | None = None
        self.last_word = ""

    # pdb writes here
    def write(self, text: str) -> int:
        return self.out.write(text)

    def flush(self) -> None:
        pass

    def _take_output(self, prompt: str) -> str:
        text = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return text[: -len(prompt)] if prompt and text.endswith(prompt) else text

    def drain(self) -> None:
        """Answer commands nobody will run (the rank left its pdb): "runs on"."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if cmd.answer is not None:
                cmd.answer("", False)

    def answer(self, paused: bool, prompt: str = "") -> None:
        """Send the output since the last command as the pending command's answer."""
        cmd, self.pending = self.pending, None
        if cmd is not None and not cmd.expired and cmd.answer is not None:
            cmd.answer(self._take_output(prompt), paused)

    # pdb reads here (the main thread, at the prompt)
    def readline(self, prompt: str = "(Pdb) ") -> str:
        self.waiting = True
        try:
            if self.pending is not None and not self.pending.expired:
                self.answer(paused=True, prompt=prompt)
            else:  # a new stop nobody is waiting for: announce it
                self.pending = None
                self.seq += 1
                _announce(self.seq, self._take_output(prompt))
            while True:
                try:
                    cmd = self.commands.get(timeout=0.25)
                except queue.Empty:
                    continue
                except KeyboardInterrupt:  # a kernel interrupt at the prompt ends debugging
                    self.last_word = "q"
                    return "q\n"
                self.pending = cmd
                self.last_word = cmd.text.strip().split(" ", 1)[0]
                return cmd.text + "\n"
        finally:
            self.waiting = False


def _announce(seq: int, text: str) -> None:
    try:
        from ipyparallel.datapub import publish_data

        publish_data({PAUSE_KEY: {"seq": seq, "text": text}})
    except Exception:  # no engine kernel (plain mpiexec): the client asks instead
        pass


_pipe = _Pipe()
_active: list[RankPdb] = []  # the pdb of the main thread, while it has one


class _BreakpointPdb(RankPdb):
    def interaction(self, frame, traceback):
        try:
            super().interaction(frame, traceback)
        finally:
            # `c` (or `q`): the rank runs on, answer now. `n`/`s` answer at the next
            # prompt, with where it stopped.
            if _pipe.last_word in _QUIT | {"c", "cont", "continue"} or sys.gettrace() is None:
                _pipe.answer(paused=False)


def _breakpoint_hook(*args, **kwargs) -> None:
    """``sys.breakpointhook`` on engines: stop here, commands come from the notebook."""
    if threading.current_thread() is not threading.main_thread():
        print("breakpoint() on a thread other than the main one: ignored.", file=sys.stderr)
        return
    if _active and _active[0].stack:  # breakpoint() called from a pdb command
        return
    caller = sys._getframe().f_back
    if not _under_cell(caller):  # no cell to stop in (pdb would trace for nothing)
        print("breakpoint() outside a %%mpi cell: ignored.", file=sys.stderr)
        return
    _pipe.drain()  # left over from an earlier stop: not for this one
    debugger = _BreakpointPdb(stdin=_pipe, stdout=_pipe)
    _active[:] = [debugger]
    debugger.set_trace(caller)


# ---------------------------------------------------------------- the request
def _reply(kernel, stream, ident, parent, content: dict) -> None:
    _ipykernel.send_reply(kernel, stream, DEBUG_REPLY, content, parent, ident)


def _on_request(kernel, stream, ident, parent) -> None:
    """Control-thread handler for :data:`DEBUG_REQUEST` (see the module docstring)."""
    content = parent.get("content", {})
    op = content.get("op")
    try:
        if op == "info":
            _reply(kernel, stream, ident, parent, _info())
        elif op == "release":
            released = _pipe.waiting
            if released:
                _pipe.commands.put(_Command("q", None))
            _reply(kernel, stream, ident, parent, {"status": "ok", "released": released})
        elif op == "close":
            _sessions.pop(content.get("session", ""), None)
            _reply(kernel, stream, ident, parent, {"status": "ok"})
        elif op == "command" and content.get("kind") == "breakpoint":
            _breakpoint_command(kernel, stream, ident, parent, content)
        elif op == "command":
            result = _post_mortem(content.get("session", ""), content.get("command", ""))
            reply = {"status": "ok", "kind": "post-mortem", "paused": False, **result}
            _reply(kernel, stream, ident, parent, reply)
        else:
            _reply(kernel, stream, ident, parent, {"status": "error", "error": f"bad op {op!r}"})
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        _reply(kernel, stream, ident, parent, {"status": "error", "error": error})


def _info() -> dict:
    return {
        "status": "ok",
        "paused": _pipe.waiting,
        "seq": _pipe.seq,
        "error": last_error(),
    }


def _breakpoint_command(kernel, stream, ident, parent, content: dict) -> None:
    if not _pipe.waiting:
        reply = {"status": "ok", "kind": "breakpoint", "paused": False, "error": "running"}
        _reply(kernel, stream, ident, parent, reply)
        return
    sent = []

    def send(output: str, paused: bool, note: str = "") -> None:  # on the control thread
        if sent:
            return
        sent.append(True)
        reply = {"status": "ok", "kind": "breakpoint", "paused": paused, "output": output}
        _reply(kernel, stream, ident, parent, {**reply, "seq": _pipe.seq, "note": note})

    def answer(output: str, paused: bool) -> None:  # on the main thread
        _ipykernel.on_control_thread(stream, send, output, paused)

    def expire() -> None:
        if not sent:
            cmd.expired = True  # its late output goes out with the next stop
            send("", False, "running")

    cmd = _Command(content.get("command", ""), answer)
    _pipe.commands.put(cmd)
    _ipykernel.later_on_control_thread(stream, float(content.get("timeout", 10.0)), expire)


def _end_of_cell(result=None) -> None:
    """IPython's ``post_run_cell``: a cell's pdb ends with the cell (a step past its
    last line must not stop in the next cell)."""
    if _active:
        sys.settrace(None)
        _active.clear()
        _pipe.answer(paused=False)
        _pipe.drain()


def install(kernel) -> None:
    """Arm breakpoints and the debug request on this engine (from ``_engine_setup``)."""
    _ipykernel.answer_control(
        kernel,
        DEBUG_REQUEST,
        lambda stream, ident, parent: _on_request(kernel, stream, ident, parent),
    )
    sys.breakpointhook = _breakpoint_hook
    events = _ipykernel.shell_of(kernel).events
    if _end_of_cell not in events.callbacks["post_run_cell"]:
        events.register("post_run_cell", _end_of_cell)
