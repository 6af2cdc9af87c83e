"""``%mpi start`` in a real Jupyter kernel: its progress is one display updated in place and
gone when the start ends; the session's cluster is ``clusterkernel.current_cluster()``, and
an old import path warns in the cell, naming the new one. In IPython, a start interrupted
(the stop button) says so in one line and leaves nothing running."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from tests._kernels import kernel
from tests._procs import cluster_processes, wait_no_cluster_processes


def _execute(kc, code: str, timeout: float = 120) -> list[dict]:
    """The cell's iopub messages, in order."""
    msgs: list[dict] = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
    assert reply["content"]["status"] == "ok", msgs
    return msgs


def _text(msg: dict) -> str:
    content = msg["content"]
    return content.get("text") or content.get("data", {}).get("text/plain", "")


def test_start_progress_is_shown_in_place_then_removed(no_shared_cluster):
    with kernel() as (km, kc):
        msgs = _execute(kc, "%load_ext clusterkernel\n%mpi start -n 2")
        kinds = ("display_data", "update_display_data")
        shown = [m for m in msgs if m["msg_type"] in kinds]
        assert shown, [(m["msg_type"], _text(m)) for m in msgs]
        # one display, made once and then only updated
        ids = {m["content"]["transient"]["display_id"] for m in shown}
        assert len(ids) == 1
        assert [m["msg_type"] for m in shown] == ["display_data"] + [kinds[1]] * (len(shown) - 1)
        lines = [_text(m) for m in shown]
        assert all(t.startswith("Starting 2 MPI ranks: ") for t in lines[:-1]), lines
        assert "Starting 2 MPI ranks: 2 of 2 registered" in lines
        assert lines[-1] == ""  # gone at the end
        streams = [m for m in msgs if m["msg_type"] == "stream"]
        said = "".join(_text(m) for m in streams)
        assert "Started 2 MPI ranks" in said and "\r" not in said  # no terminal line here
        assert msgs.index(shown[-1]) < msgs.index(streams[-1])

        code = (
            "import clusterkernel\n"
            "from clusterkernel.magics import current_cluster\n"
            "print(clusterkernel.current_cluster() is current_cluster(), "
            "clusterkernel.current_cluster().n)"
        )
        said = "".join(_text(m) for m in _execute(kc, code) if m["msg_type"] == "stream")
        assert "True 2" in said
        assert "DeprecationWarning" in said and "import clusterkernel.client.magics" in said
        _execute(kc, "%mpi stop")
    assert not wait_no_cluster_processes(30)


def test_in_a_terminal_the_line_is_rewritten_with_cr_and_erased(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from clusterkernel.client.magics._progress import LiveLine

    line = LiveLine(InteractiveShell.instance())  # a terminal's shell: no kernel
    assert not line.in_kernel
    for text in ("Starting 2 MPI ranks: the controller", "Starting 2 MPI ranks: 1 of 2", None):
        line(text)
    out = capsys.readouterr().out
    first, second, gone = out.split("\r")[1:4]
    assert first == "Starting 2 MPI ranks: the controller" and "\n" not in out
    # a shorter line blanks what is left of the longer one, and the end blanks it all
    assert second.rstrip() == "Starting 2 MPI ranks: 1 of 2" and len(second) == len(first)
    assert gone.strip() == "" and len(gone) >= len(second.rstrip()) and out.endswith("\r")


def test_an_interrupt_during_start_is_one_line_and_leaves_nothing_running(
    no_shared_cluster, capsys
):
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    ck_magics._magics.cluster = None

    def interrupt_once_launched():
        # the stop button, pressed once the ranks' processes run and before they register
        deadline = time.monotonic() + 60
        while not _engines_launched() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    # a kernel's SIGINT handler while a cell runs is Python's: the same here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_once_launched, daemon=True)
    watcher.start()
    try:
        result = sh.run_cell("%mpi start -n 4", store_history=True)
        watcher.join(70)
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError), (out, err)
    assert err.strip() == (
        "UsageError: Start interrupted: no rank left running (the ranks and controller it "
        "had started are stopped). %mpi start starts them again."
    ), err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert ck_magics._magics.cluster is None
    assert not wait_no_cluster_processes(20)


def _engines_launched() -> bool:
    """Whether an ipyparallel engine of this test session runs."""
    for proc in cluster_processes():
        try:
            if "ipyparallel.engine" in " ".join(proc.cmdline()):
                return True
        except psutil.Error:  # gone since it was listed
            pass
    return False
