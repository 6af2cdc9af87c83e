"""The debugger in a real Jupyter kernel with stdin: a breakpoint's prompt under the
cell, ``%mpi debug``'s prompt, and a kernel interrupt at the prompt.

The kernel starts its own 2-rank cluster, so the shared one is stopped first.
"""

from __future__ import annotations

import pytest
from jupyter_client import KernelManager

from tests._kernels import kernel
from tests._procs import wait_no_cluster_processes

STOPPING = """\
%%mpi
from clusterkernel import comm
x = comm.rank() * 10 + 7
if comm.rank() == 1:
    breakpoint()
    y = x + 5
print(f"done {comm.rank()}")
"""


class _Front:
    """A front end that answers input requests from a script of lines."""

    def __init__(self, km: KernelManager, kc) -> None:
        self.km, self.kc = km, kc
        self.prompts: list[str] = []
        self.lines: list[str] = []
        self.interrupt_at_prompt = False

    def stdin_hook(self, msg) -> None:
        self.prompts.append(msg["content"]["prompt"])
        if self.interrupt_at_prompt:
            self.km.interrupt_kernel()  # and leave the prompt unanswered
        else:
            self.kc.input(self.lines.pop(0))

    def run(self, code: str, lines=(), timeout: float = 120) -> tuple[str, dict]:
        self.lines = list(lines)
        chunks: list[str] = []

        def output(msg) -> None:
            content, kind = msg["content"], msg["msg_type"]
            if kind == "stream":
                chunks.append(content["text"])
            elif kind in ("display_data", "update_display_data", "execute_result"):
                chunks.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                chunks.append("\n".join(content["traceback"]) + "\n")

        reply = self.kc.execute_interactive(
            code,
            timeout=timeout,
            allow_stdin=True,
            stdin_hook=self.stdin_hook,
            output_hook=output,
        )
        return "".join(chunks), reply["content"]


@pytest.fixture
def front(no_shared_cluster):
    with kernel() as (km, kc):
        f = _Front(km, kc)
        f.run("%load_ext clusterkernel")
        out, _ = f.run("%mpi start -n 2")
        assert "Started 2 MPI ranks" in out, out
        yield f
        f.run("%mpi stop")
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"


def test_breakpoint_prompt_post_mortem_prompt_and_interrupt(front):
    # a breakpoint on rank 1: its prompt under the cell; rank 0 finishes meanwhile
    out, reply = front.run(STOPPING, lines=["p x", "c"])
    assert reply["status"] == "ok", out
    assert front.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert "stopped at breakpoint():\n> cell(5)<module>()\n-> y = x + 5" in out
    assert "[rank 1] 17" in out and "done 0" in out and "done 1" in out

    # post-mortem through %mpi debug's own prompt, ended by q
    front.prompts.clear()
    out, reply = front.run("%%mpi\nif comm.rank() == 1:\n    z = x * 2\n    1 / 0")
    assert reply["status"] == "error" and "ZeroDivisionError" in out
    out, reply = front.run("%mpi debug", lines=["p z", "p x + 1", "q"])
    assert reply["status"] == "ok", out
    assert front.prompts == ["(Pdb rank 1) "] * 3
    assert "[rank 1] post-mortem of ZeroDivisionError: division by zero" in out
    assert "[rank 1] 34" in out and "[rank 1] 18" in out

    # a kernel interrupt at the breakpoint's prompt ends the cell; the ranks stay usable
    front.prompts.clear()
    front.interrupt_at_prompt = True
    out, reply = front.run(STOPPING)
    front.interrupt_at_prompt = False
    assert front.prompts == ["(Pdb rank 1) "]
    assert reply["status"] == "error" and "interrupted" in out, out
    out, reply = front.run("%%mpi\nprint(f'again {x}')")
    assert reply["status"] == "ok" and "again 7" in out and "again 17" in out, out
    assert "restarted" not in out
