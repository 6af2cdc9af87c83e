"""%mpi / %%mpi in a real IPython shell, driving the session's real cluster."""

from __future__ import annotations

import re
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from tests._labels import per_rank_lines


@pytest.fixture
def shell(cluster, capsys):
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = cluster  # the session's cluster, as if %mpi start had made it
    yield sh
    magics._sub_off("")
    magics.cluster = None  # the fixture, not the test, owns the cluster's life


def test_help_is_generated(shell, capsys):
    shell.run_line_magic("mpi", "")
    out = capsys.readouterr().out
    for text in ("%mpi start", "--hosts", "%%mpi", "--ranks", "--timeout", "--noblock", "pull"):
        assert text in out
    assert "--rank" in ck_magics.MPIMagics.mpi.__doc__


def test_cell_runs_on_selected_ranks_in_rank_prefixed_lines(shell, capsys):
    shell.run_cell_magic(
        "mpi", "--ranks 1,3", "from mpi4py import MPI\nprint('r', MPI.COMM_WORLD.Get_rank())"
    )
    out = capsys.readouterr().out
    assert "[rank 1] r 1" in out and "[rank 3] r 3" in out
    assert "[rank 0]" not in out


def test_push_pull_status(shell, capsys):
    shell.user_ns["a"] = 5
    shell.run_line_magic("mpi", "push a")
    shell.run_line_magic("mpi", "push b=a * 10")
    shell.run_cell_magic("mpi", "", "from mpi4py import MPI\nc = a + b + MPI.COMM_WORLD.Get_rank()")
    assert shell.run_line_magic("mpi", "pull c") == {0: 55, 1: 56, 2: 57, 3: 58}
    assert shell.run_line_magic("mpi", "pull c --rank 2") == 57
    shell.run_line_magic("mpi", "status")
    out = capsys.readouterr().out
    assert "rank" in out and "idle" in out and out.count("\n") >= 5


def test_on_off_sends_every_cell_to_the_ranks(shell, capsys):
    shell.run_line_magic("mpi", "on")
    shell.run_cell("from mpi4py import MPI\nprint('auto', MPI.COMM_WORLD.Get_rank())")
    shell.run_cell("%mpi off")
    shell.run_cell("print('local')")
    out = capsys.readouterr().out
    assert "[rank 2] auto 2" in out  # lines that differ keep their own rank
    assert "local" in out and "[rank 0] local" not in out


@pytest.mark.parametrize(
    "line, message",
    [
        ("start -n 2", "already running"),
        ("bogus", "Unknown subcommand"),
        ("pull", "arguments are required"),
        ("push nosuchvar", "No variable named"),
        ("pull c --rank 9", "Rank 9 does not exist"),
        ("timeout soon", "seconds or 'off'"),
    ],
)
def test_usage_errors(shell, line, message):
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("mpi", line)


def test_cell_usage_errors(shell):
    with pytest.raises(UsageError, match="No rank"):
        shell.run_cell_magic("mpi", "--ranks 0,7", "pass")
    with pytest.raises(UsageError, match="--ranks takes"):
        shell.run_cell_magic("mpi", "--ranks one", "pass")


def test_noblock_returns_a_handle(shell, capsys):
    run = shell.run_cell_magic("mpi", "--noblock", "import time\ntime.sleep(0.5)\nprint('nb')")
    assert run is not None and not run.done
    run.wait()
    assert run.done
    assert sorted(per_rank_lines(capsys.readouterr().out)) == [(r, "nb") for r in range(4)]


def test_no_cluster_is_a_usage_error(shell):
    ck_magics._magics.cluster = None
    with pytest.raises(UsageError, match="%mpi start"):
        shell.run_cell_magic("mpi", "", "pass")


def test_where_shows_a_blocked_ranks_cell_line_and_locals(shell, capsys):
    # ranks 0 and 2 wait in a Barrier that ranks 1 and 3 have not reached yet
    run = shell.run_cell_magic(
        "mpi",
        "--noblock",
        "import time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
        "secret = 40 + r\nif r % 2:\n    time.sleep(4)\nMPI.COMM_WORLD.Barrier()\n",
    )
    time.sleep(1.5)
    capsys.readouterr()
    shell.run_line_magic("mpi", "where --ranks 0,2 --locals")
    out = capsys.readouterr().out
    run.wait()
    assert "[rank 0]" in out and "[rank 2]" in out
    assert "Cell line 7" in out and "MPI.COMM_WORLD.Barrier()" in out
    assert re.search(r"secret\s+= 40", out) and re.search(r"secret\s+= 42", out), out
    assert "_handle.py" not in out and "Current thread" not in out


def test_expected_conditions_are_messages_not_tracebacks(shell, cluster):
    import threading

    # an unpicklable value: its name and type, before anything is sent
    shell.user_ns.update(ok=1, lock=threading.Lock())
    with pytest.raises(UsageError, match=r"lock \(_thread.lock\): cannot pickle"):
        shell.run_line_magic("mpi", "push ok lock")
    # a rank that died: every subcommand says so, as a UsageError naming the rank
    with pytest.raises(Exception, match=r"\[rank 2\] exit code 3"):
        shell.run_cell_magic("mpi", "--ranks 2", "import os\nos._exit(3)")
    for line in ("status", "push ok", "pull ok", "where"):
        with pytest.raises(UsageError, match=r"rank 2 died \(exit code 3\).*%mpi restart"):
            shell.run_line_magic("mpi", line)
    cluster.restart()


def test_a_syntax_error_names_the_users_cell_in_its_summary_as_in_its_traceback(shell, capsys):
    shell.execution_count = 600  # far from any engine's own counter
    result = shell.run_cell("%%mpi\nx = 1\ny = (2 +", store_history=True)
    assert not result.success
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    summary = next(line for line in shown.splitlines() if "SyntaxError" in line)
    assert "(Cell In[600], line 2)" in summary, shown  # not the engine's "<hash>.py, line 2"
    assert not re.search(r"\d+\.py", shown), shown
    assert "Cell In[600], line 2" in shown.replace(summary, "")  # the traceback says the same
