"""%mpi / %%mpi in a real IPython shell, driving the session's real cluster."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from tests._kernels import wait_until
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
        ("timeout soon", "seconds above 0"),
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


def test_where_shows_a_blocked_ranks_cell_line_and_locals(shell, capsys, tmp_path):
    # ranks 0 and 2 wait in a Barrier that ranks 1 and 3 reach only once the test has
    # looked (the file `release`; at most 2 minutes)
    release = tmp_path / "release"
    run = shell.run_cell_magic(
        "mpi",
        "--noblock",
        "import os, time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
        f"secret = 40 + r\nwhile r % 2 and not os.path.exists({str(release)!r}):\n"
        "    time.sleep(0.05)\nMPI.COMM_WORLD.Barrier()\n",
    )
    try:

        def both_in_the_barrier() -> str:
            # each rank's own section at its Barrier line with the cell's locals: a look
            # that caught rank 2 on its way in (ipykernel publishing "busy") looks again
            capsys.readouterr()
            shell.run_line_magic("mpi", "where --ranks 0,2 --locals")
            out = capsys.readouterr().out
            parts = out.split("[rank 2]")
            there = len(parts) == 2 and all(
                "MPI.COMM_WORLD.Barrier()" in part and re.search(rf"secret\s+= {40 + r}", part)
                for r, part in zip((0, 2), parts)
            )
            return out if there else ""

        out = wait_until(both_in_the_barrier, 60, "ranks 0 and 2 in the Barrier")
    finally:
        release.touch()
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


# A typo or a bad value, typed as a user types it: one short line that says what to write,
# and nothing starts (the shared cluster is set, so a start that got past its parser would
# say "already running" instead).
@pytest.mark.parametrize(
    "line, message",
    [
        ("%mpi strat", "Unknown subcommand 'strat'. Did you mean 'start'? (%mpi help lists them)"),
        ("%mpi xyzzy", "Unknown subcommand 'xyzzy'; %mpi takes attach, dashboard, debug,"),
        (
            "%mpi start --fault-tolerent",
            "%mpi start: unknown option --fault-tolerent. Did you mean --fault-tolerant?",
        ),
        ("%mpi start --zzz", "%mpi start: unknown option --zzz. %mpi help start lists its"),
        ("%mpi export --sbach j.sbatch j.py", "unknown option --sbach. Did you mean --sbatch?"),
        ("%mpi start --backend ncl", "--backend 'ncl' is not one of gloo, nccl. Did you mean"),
        ("%mpi profile strt", "action 'strt' is not one of start, stop, snapshots. Did you"),
        ("%mpi start -n 0", "%mpi start: -n takes a number of ranks, 1 or more, e.g. -n 4; got 0"),
        ("%mpi start -n -2", "-n takes a number of ranks, 1 or more, e.g. -n 4; got -2"),
        ("%mpi start --timeout nan", "--timeout takes seconds above 0, e.g. --timeout 60"),
        ("%mpi start --gpus-per-rank 0", "1 or more, e.g. --gpus-per-rank 2 (--no-gpu-binding"),
        ("%%mpi --timeout -1\nprint('ran')", "%%mpi: --timeout takes seconds above 0, e.g."),
        ("%%mpi --timeout 0\nprint('ran')", "--timeout takes seconds above 0"),
        ("%%mpi --timout 5\nprint('ran')", "%%mpi: unknown option --timout. Did you mean"),
        ("%mpi timeout -1", "%mpi timeout takes seconds above 0, e.g. %mpi timeout 60 (or off"),
        ("%mpi profile start --every -5s", "--every takes a duration such as 60s, 5m or 1h"),
        ("%mpi profile start --every 0", "--every is at least 0.1 s"),
        ("%mpi profile start --hz 0", "--hz takes samples per second above 0, e.g. --hz 100"),
        ("%mpi respawn --from -1", "%mpi respawn: --from takes a rank number, e.g. --from 0"),
        ("%mpi pull x --rank -1", "%mpi pull: --rank takes a rank number"),
        ("%mpi pull x y", "%mpi pull: unexpected 'y'. Usage: %mpi pull [--rank RANK] name"),
        ("%mpi start -n", "%mpi start: -n needs a value: number of MPI ranks"),
        ("%mpi status now", "%mpi status takes no arguments; got 'now'."),
    ],
)
def test_a_typo_or_bad_value_is_one_line_saying_what_to_write(shell, capsys, line, message):
    before, timeout = shell.execution_count, ck_magics._magics.cluster.timeout
    result = shell.run_cell(line, store_history=True)
    out, err = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError), (out, err)
    assert err.startswith("UsageError: ") and message in err, err
    assert "Traceback" not in err + out
    assert err.strip().count("\n") == 0  # one line
    assert "ran" not in out and shell.execution_count == before + 1
    assert ck_magics._magics.cluster.timeout == timeout  # %mpi timeout -1 set nothing


def test_help_lists_the_subcommands_and_one_subcommands_options(shell, capsys):
    shell.run_line_magic("mpi", "help")
    listing = capsys.readouterr().out
    for sub in ("%mpi start", "%mpi stop", "%mpi export", "%mpi help", "%%mpi"):
        assert sub in listing
    assert "--fault-tolerant" in listing and "Options of" not in listing  # usage lines only
    shell.run_line_magic("mpi", "help start")
    one = capsys.readouterr().out
    assert (
        one.startswith("%mpi start [-n N]") and "fault-tolerant" in one and "%mpi stop" not in one
    )
    shell.run_line_magic("mpi", "help stop")
    assert capsys.readouterr().out == "%mpi stop\n    stop every rank and the controller\n"
    with pytest.raises(UsageError, match="Did you mean 'start'"):
        shell.run_line_magic("mpi", "help strt")


def test_a_comment_after_a_magic_is_a_comment(shell, capsys):
    # IPython hands a line magic its whole line: a trailing comment must not be an argument
    shell.run_line_magic("mpi", "status  # how are the ranks?")
    assert "idle" in capsys.readouterr().out
    shell.run_cell_magic("mpi", "--ranks 1  # just one", "print('only', 1)")
    out = capsys.readouterr().out
    assert "[rank 1] only 1" in out and "[rank 0]" not in out
    shell.run_line_magic("mpi", "push tag='#1'  # a quoted hash stays")
    assert shell.run_line_magic("mpi", "pull tag --rank 0") == "#1"
