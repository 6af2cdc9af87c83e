"""pdb on real ranks: post-mortem after a failed cell, breakpoint() in a running cell,
driven through ``cluster.debug`` and ``%mpi debug`` (the session's 4-rank cluster)."""

from __future__ import annotations

import builtins
import io
import re
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster
from clusterkernel.client.errors import CellInterrupted, ClusterError, RankError
from clusterkernel.client.output import TerminalRenderer

# ranks 1 and 3 fail inside a function, with values that differ per rank
FAILING = """\
from clusterkernel import comm
x = comm.rank() * 10
def scale(y):
    z = y + 1
    raise ValueError(f"bad {z}")
if comm.rank() in (1, 3):
    scale(x)
"""

# rank 1 stops; the others finish the cell meanwhile
STOPPING = """\
from clusterkernel import comm
x = comm.rank() * 10
if comm.rank() == 1:
    breakpoint()
    y = x + 5
print(f"done {comm.rank()}")
"""

_FORGET_ERRORS = "import sys\nfor _n in ('last_type', 'last_value', 'last_traceback'):\n"
_FORGET_ERRORS += "    sys.__dict__.pop(_n, None)\n"


def _quiet(cluster: Cluster, stream=None) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=stream or io.StringIO())


@pytest.fixture
def failed(cluster):
    """The cluster after FAILING raised on ranks 1 and 3 (and nowhere before)."""
    cluster.run(_FORGET_ERRORS, renderer=_quiet(cluster))
    with pytest.raises(RankError) as info:
        cluster.run(FAILING, renderer=_quiet(cluster))
    assert info.value.ranks == [1, 3]
    return cluster


@pytest.fixture
def shell(cluster):
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    ck_magics._magics.cluster = cluster  # as if %mpi start had made it
    yield sh
    ck_magics._magics.cluster = None  # the fixture, not the test, owns the cluster


def _stopped(cluster: Cluster, rank: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.debug([rank]).state[rank] == "breakpoint":
            return
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} did not stop at breakpoint() within {timeout} s")


def test_post_mortem_answers_per_rank(failed):
    with failed.debug(ranks=[1, 3]) as dbg:
        assert dbg.state == {1: "post-mortem", 3: "post-mortem"}
        assert dbg.errors == {1: "ValueError: bad 11", 3: "ValueError: bad 31"}
        # the debugger starts in the frame that raised
        assert dbg.send("p z") == {1: "11", 3: "31"}
        assert dbg.send("args") == {1: "y = 10", 3: "y = 30"}
        where = dbg.send("where")
        for rank in (1, 3):
            assert "cell(7)<module>()\n-> scale(x)" in where[rank], where[rank]
            assert where[rank].endswith('cell(5)scale()\n-> raise ValueError(f"bad {z}")')
            assert "interactiveshell" not in where[rank]  # IPython's frames are left out
        assert "def scale(y):" in dbg.send("list")[1]
        assert "cell(7)<module>()" in dbg.send("up")[3]
        assert dbg.send("p x") == {1: "10", 3: "30"}
        assert dbg.send("pp [x, x]") == {1: "[10, 10]", 3: "[30, 30]"}
        assert re.search(r"^x\s+= 30$", dbg.send("locals")[3], re.M)
        assert "cell(5)scale()" in dbg.send("down")[1]
        assert dbg.send("p y * 2") == {1: "20", 3: "60"}
        # post-mortem can look, not run: the frames have finished
        assert "already ended" in dbg.send("c")[1]
        answers = dbg.send("n")
        assert "already ended" in answers[3]
        assert str(dbg.send("p z")) == "[rank 1] 11\n[rank 3] 31"


def test_ranks_without_a_traceback_say_which_ranks_have_one(failed):
    with failed.debug(ranks=[0, 1]) as dbg:
        assert dbg.state == {0: None, 1: "post-mortem"}
        answers = dbg.send("p x")
    assert answers[1] == "10"
    assert "rank 0 has no traceback" in answers[0] and "traceback: 1,3" in answers[0]
    assert failed.debug().ranks == [1, 3]  # default: the ranks whose cell raised


def test_nothing_to_debug_is_a_clear_error(cluster):
    cluster.run(_FORGET_ERRORS, renderer=_quiet(cluster))
    with pytest.raises(ClusterError, match="No rank is stopped at breakpoint"):
        cluster.debug()
    with pytest.raises(ValueError, match="Rank 9 does not exist"):
        cluster.debug(ranks=[9])


def test_breakpoint_on_one_rank_while_the_others_run(cluster):
    run = cluster.run(STOPPING, block=False, renderer=_quiet(cluster))
    try:
        _stopped(cluster, 1)

        # A finished rank's output may trail its reply (ipyparallel streams it
        # separately): wait for both, as the run itself does, before comparing.
        def others_done() -> bool:
            printed = all(run.output(r).stdout == f"done {r}\n" for r in (0, 2, 3))
            return run.busy_ranks() == [1] and printed

        deadline = time.monotonic() + 30
        while not others_done() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run.busy_ranks() == [1]  # the others finished their cell and printed
        for rank in (0, 2, 3):
            assert run.output(rank).stdout == f"done {rank}\n"
        assert run.output(1).stdout == ""
        dbg = cluster.debug()  # default: the rank at a breakpoint
        assert dbg.ranks == [1] and dbg.state == {1: "breakpoint"}
        assert dbg.send("where")[1] == "> cell(5)<module>()\n-> y = x + 5"
        assert dbg.send("p x") == {1: "10"}
        assert dbg.send("n")[1] == '> cell(6)<module>()\n-> print(f"done {comm.rank()}")'
        assert dbg.send("p y") == {1: "15"}
        assert dbg.send("c") == {1: ""}
        assert dbg.state == {1: "running"}
        assert "no longer stopped" in dbg.send("p x")[1]
        run.wait(timeout=30)
    finally:
        cluster.debug([1]).release()  # a failed test must not leave rank 1 stopped
        if not run.done:  # nor its cell running into the next test's
            try:
                run.wait(timeout=30)
            except Exception:  # the assertion that failed above is the report
                pass
    assert run.output(1).stdout == "done 1\n"


def test_without_stdin_the_cell_says_how_to_debug_and_runs_on(cluster):
    # pytest's captured stdin: input() raises, as a front end without input does
    out = io.StringIO()
    cluster.run(STOPPING, renderer=_quiet(cluster, out), timeout=60)
    text = out.getvalue()
    assert "[rank 1]\nstopped at breakpoint():\n> cell(5)<module>()" in text
    assert "sends no input" in text and "%mpi debug --ranks 1" in text
    assert "[rank 1] done 1" in text


def test_prompt_answers_and_interrupt_at_the_prompt(cluster, monkeypatch):
    lines = iter(["p x", "n", "p y", "c"])
    prompts = []

    def answer(prompt=""):
        prompts.append(prompt)
        return next(lines)

    monkeypatch.setattr(builtins, "input", answer)
    out = io.StringIO()
    cluster.run(STOPPING, renderer=_quiet(cluster, out), timeout=60)
    assert prompts == ["(Pdb rank 1) "] * 4
    text = out.getvalue()
    assert "[rank 1] 10\n" in text and "[rank 1] 15\n" in text and "[rank 1] done 1" in text

    def interrupt(prompt=""):  # what a kernel interrupt does to input()
        raise KeyboardInterrupt

    monkeypatch.setattr(builtins, "input", interrupt)
    with pytest.raises(CellInterrupted) as info:
        cluster.run(STOPPING, renderer=_quiet(cluster), timeout=60)
    report = "\n".join(info.value.render(color=False))
    assert "[rank 1] interrupted: stopped at breakpoint(); its pdb quit" in report
    assert "restarted" not in str(info.value)  # nothing was stuck
    assert not cluster.lost
    again = io.StringIO()
    cluster.run("print('again', x)", renderer=_quiet(cluster, again))
    assert "[rank 1] again 10" in again.getvalue()


def test_debug_magic_with_one_command(failed, shell, capsys):
    shell.run_line_magic("mpi", 'debug --ranks 1,3 -c "p x"')
    assert capsys.readouterr().out == "[rank 1] 10\n[rank 3] 30\n"
    shell.run_line_magic("mpi", 'debug --ranks 1-3 -c "p type(z).__name__"')
    out = capsys.readouterr().out
    assert "[ranks 1,3] 'int'" in out and "rank 2 has no traceback" in out
    with pytest.raises(UsageError, match="Rank 7 does not exist"):
        shell.run_line_magic("mpi", "debug --ranks 7")
    with pytest.raises(UsageError, match="ranks like 0,2 or 0-3"):
        shell.run_line_magic("mpi", "debug --ranks one")
    with pytest.raises(UsageError, match="sends no input"):  # pytest's stdin
        shell.run_line_magic("mpi", "debug")
