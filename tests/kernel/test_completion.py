"""Tab and Shift-Tab reach the ranks' names, through real kernels (jupyter_client).

- the MPI kernel: rank 0's names (and a ``%%mpi --ranks`` cell's rank) from the first
  Tab on, attribute and dict-key completion, ``obj?``/``obj??`` as Shift-Tab asks them
  and as a cell (answered once, by rank 0), ``%%local`` cells from the kernel's own
  names, nothing typed is run;
- an ordinary kernel: the same inside ``%%mpi`` cells, and while a cell runs, asked on
  a subshell as JupyterLab does: the rank's control thread answers, and a rank whose
  main thread holds the GIL is answered from the names it listed last.
"""

from __future__ import annotations

import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

from tests.kernel.test_restart import _run


def _ask(kc, msg_type: str, content: dict, subshell: str | None = None) -> dict:
    msg = kc.session.msg(msg_type, content)
    if subshell is not None:
        msg["header"]["subshell_id"] = subshell
    kc.shell_channel.send(msg)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def _complete(kc, code: str, cursor_pos: int | None = None, subshell: str | None = None):
    cursor = len(code) if cursor_pos is None else cursor_pos
    return _ask(kc, "complete_request", {"code": code, "cursor_pos": cursor}, subshell)


def _inspect(kc, code: str, detail_level: int = 0) -> dict:
    content = {"code": code, "cursor_pos": len(code), "detail_level": detail_level}
    reply = _ask(kc, "inspect_request", content)
    # IPython colours source and headings with ANSI codes, as in any kernel: read the text
    data = reply.get("data") or {}
    if "text/plain" in data:
        data["text/plain"] = _ANSI.sub("", data["text/plain"])
    return reply


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _shown(kc, code: str, mime: str = "text/") -> str:
    """Everything a cell shows: its streams and the text of its displays (those of
    ``mime`` only, e.g. "text/html": what JupyterLab renders)."""
    shown = []

    def hook(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            shown.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            shown.extend(str(v) for k, v in content["data"].items() if k.startswith(mime))

    reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(shown)


def _ok(kc, code: str) -> str:
    reply, out = _run(kc, code)
    assert reply["status"] == "ok", (reply, out)
    return out


@pytest.fixture
def kernel_named(request):
    started = []

    def start(name: str):
        km, kc = start_new_kernel(kernel_name=name, startup_timeout=60)
        started.append((km, kc))
        return kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=False)


def test_the_mpi_kernel_completes_and_inspects_rank_names(mpi_kernel, kernel_named):
    kc = kernel_named(mpi_kernel)
    # no ranks yet: completion answers from the kernel and starts none
    assert "zz_on_ranks_only" not in _complete(kc, "zz_on_r")["matches"]
    # the ranks' start warmed what a first cell and a first Tab need: comm imported on
    # every rank, and rank 0's completer has parsed the builtins' stubs (no completion
    # has been asked of it yet)
    warmed = _shown(
        kc,
        "import sys, parso\n"
        "print('warmed', 'clusterkernel.comm' in sys.modules, bool(parso.cache.parser_cache))",
        "text/plain",
    )
    assert "[rank 0]" in warmed and "warmed True True" in warmed, warmed
    assert "warmed True False" in warmed, warmed  # rank 1: comm, but no completer
    _ok(
        kc,
        "import torch\nfrom mpi4py import MPI\nzz_on_ranks_only = 41\n"
        "settings = {'alpha_key': 1, 'beta_key': 2}\nran = []\n"
        "def rank_fn(x):\n    '''Doubles x, on the ranks.'''\n    return 2 * x\n"
        "def side_effect():\n    ran.append(1)\n    return 'text'\n"
        "if MPI.COMM_WORLD.rank == 1:\n    zz_only_on_one = 1\n"
        "zz_per_rank = 100 + MPI.COMM_WORLD.rank\n",
    )
    # the first Tab, at once: rank 0 answers it as it answers every later one (it used to
    # outlast its one-second wait while the rank loaded jedi, and found no names listed)
    reply = _complete(kc, "zz_on_r")
    assert reply["matches"] == ["zz_on_ranks_only"], reply
    assert (reply["cursor_start"], reply["cursor_end"]) == (0, 7)
    assert reply["metadata"]["clusterkernel"] == {"rank": 0, "from": "rank"}
    _ok(kc, "%%local\nzz_local_only = 7")

    reply = _complete(kc, "y = 1\ntorch.zer")
    assert {"zeros", "zeros_like"} <= set(reply["matches"]), reply
    assert reply["cursor_start"] == len("y = 1\ntorch."), reply

    keys = _complete(kc, "settings['al")
    assert any("alpha_key" in m for m in keys["matches"]), keys

    # a name only rank 1 has: found in a cell on rank 1, not in one on rank 0
    assert _complete(kc, "zz_only")["matches"] == []
    reply = _complete(kc, "%%mpi --ranks 1\nzz_only")
    assert reply["matches"] == ["zz_only_on_one"], reply
    assert reply["cursor_start"] == len("%%mpi --ranks 1\n")
    # on the %%mpi line itself: the magic's own options, from the kernel
    assert "zz_only_on_one" not in _complete(kc, "%%mpi --ranks 1\nzz_only", 9)["matches"]

    # %%local cells: the kernel's names, not the ranks'
    local = _complete(kc, "%%local\nzz_")["matches"]
    assert "zz_local_only" in local and "zz_on_ranks_only" not in local
    assert "zz_local_only" not in _complete(kc, "zz_")["matches"]

    # Shift-Tab and obj?? : the rank's object, docstring and source
    found = _inspect(kc, "zz_on_ranks_only")
    assert found["found"] and "41" in found["data"]["text/plain"], found
    doc = _inspect(kc, "rank_fn")["data"]["text/plain"]
    assert "Doubles x, on the ranks." in doc
    source = _inspect(kc, "rank_fn", detail_level=1)["data"]["text/plain"]
    assert "return 2 * x" in source, source
    # as a cell: each rank's page, in plain text as a kernel shows it (not "[31mType:")
    page = _shown(kc, "rank_fn?", "text/html")
    assert "Doubles x, on the ranks." in page and "Signature:" in page, page
    assert "\x1b" not in page and "[31m" not in page, page
    # asked once, answered once: rank 0's page, named, not one per rank (they differ here)
    for ask in ("zz_per_rank?", "zz_per_rank??"):
        page = _shown(kc, ask, "text/html")
        assert "[rank 0]" in page and "String form: 100" in page, page
        assert "rank 1" not in page and "String form: 101" not in page, page
    assert not _inspect(kc, "zz_local_only")["found"]  # a kernel-side name, in a rank cell
    assert _inspect(kc, "%%local\nzz_local_only")["found"]

    # completing a call's attributes runs nothing on the ranks
    _complete(kc, "side_effect().")
    _complete(kc, "side_effect().up")
    _inspect(kc, "side_effect()")
    out = _shown(kc, "print('calls', len(ran))")
    assert "calls 0" in out and "calls 1" not in out, out


def test_an_ordinary_kernel_completes_in_mpi_cells_even_while_one_runs(
    no_shared_cluster, kernel_named, tmp_path
):
    kc = kernel_named("python3")
    info = _ask(kc, "kernel_info_request", {})
    if "kernel subshells" not in info.get("supported_features", []):
        pytest.skip("this ipykernel has no subshells")
    _ok(kc, "%load_ext clusterkernel")
    _ok(kc, "%mpi start -n 2")
    try:
        _ok(kc, "%%mpi\nimport re, time\nzz_rank_value = 5\nzz_second = 6")
        _ok(kc, "zz_client_value = 1")
        reply = _complete(kc, "%%mpi\nzz_r")
        assert reply["matches"] == ["zz_rank_value"], reply
        assert reply["cursor_start"] == len("%%mpi\n")
        assert "zz_rank_value" not in _complete(kc, "zz_")["matches"]  # not a rank cell
        page = _shown(kc, "%%mpi\nzz_rank_value?", "text/html")  # as JupyterLab renders it
        assert "Type:" in page and "int" in page and "\x1b" not in page, page

        sent = kc.session.msg("create_subshell_request", {})
        kc.control_channel.send(sent)
        subshell = kc.get_control_msg(timeout=30)["content"]["subshell_id"]

        # a rank sleeping in its cell: its control thread answers, from its live namespace
        running = kc.execute(
            "%%mpi\nzz_made_in_cell = 1\nprint('zz in', flush=True)\ntime.sleep(4)"
        )
        _wait_output(kc, running, "zz in")
        reply = _complete(kc, "%%mpi\nzz_ma", subshell=subshell)
        assert reply["matches"] == ["zz_made_in_cell"], reply
        assert reply["metadata"]["clusterkernel"]["from"] == "rank"
        _wait_reply(kc, running)

        # a rank whose main thread holds the GIL (a regular expression backtracking in C,
        # seconds a match, again until the test is done: one match could end before a
        # slow relay of 'zz in' lets the question reach it) cannot answer: the names it
        # listed last, with no wait past the deadline
        stop = tmp_path / "stop"
        running = kc.execute(
            "%%mpi\nimport os\nprint('zz in', flush=True)\n"
            f"while not os.path.exists({str(stop)!r}):\n"
            "    re.match(r'(a+)+$', 'a' * 27 + 'b')"
        )
        _wait_output(kc, running, "zz in")
        try:
            reply = _complete(kc, "%%mpi\nzz_se", subshell=subshell)
        finally:
            stop.touch()
        assert reply["metadata"]["clusterkernel"]["from"] == "cache", reply
        assert reply["matches"] == ["zz_second"], reply
        _wait_reply(kc, running, timeout=240)
    finally:
        _run(kc, "%mpi stop")


def _wait_output(kc, msg_id: str, text: str, timeout: float = 60) -> None:
    """Until cell ``msg_id`` printed ``text`` (no fixed pause: the rank is there now)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.1))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if msg["msg_type"] == "stream" and text in content["text"]:
            return
        if any(text in str(v) for v in content.get("data", {}).values()):  # a rank area
            return
        assert msg["msg_type"] != "error", msg["content"]


def _wait_reply(kc, msg_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return reply["content"]
    raise AssertionError("the cell did not end")
