"""``%mpi export`` in a real IPython shell on the session's real cluster, and ``%mpi?``.

The export test starts the shared cluster: run it under the machine-wide lock.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel.__main__ import main as cli_main
from clusterkernel.client.magics import _args
from tests._labels import per_rank_lines
from tests._mpirun import kill_session


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    sh.history_manager.reset()  # %mpi export reads the history: start it empty,
    sh.execution_count = 1  # numbered as a fresh notebook's In [n]
    ck_magics._magics.failed_cells.clear()  # ... and with no failed cell yet
    yield sh
    ck_magics._magics._sub_off("")
    ck_magics._magics.cluster = None  # the fixture, not the test, owns the cluster's life


def _run(sh: InteractiveShell, cell: str) -> None:
    result = sh.run_cell(cell, store_history=True)  # as a notebook does: into In[]
    assert result.success, result.error_in_exec or result.error_before_exec


def test_export_from_a_live_session(shell, cluster, tmp_path, capsys):
    ck_magics._magics.cluster = cluster  # the session's cluster, as if %mpi start had made it
    _run(shell, "import numpy as np\nfactor = 7\nweights = np.linspace(0, 1, 5)")
    _run(shell, "%mpi push factor weights")
    _run(shell, "%%mpi --ranks 2\nfrom mpi4py import MPI\nval = factor * MPI.COMM_WORLD.Get_rank()")
    _run(shell, "%mpi on")
    _run(shell, "auto_sum = float(weights.sum()) * factor")
    _run(shell, "%mpi off")
    _run(shell, "factor = 8  # changed after the push: the export takes the value now")
    assert shell.run_line_magic("mpi", "pull val --rank 2") == 14
    job, sb = tmp_path / "job.py", tmp_path / "job.sbatch"
    _run(shell, f"%mpi export {job} --sbatch {sb} --time 5 --partition debug")
    printed = capsys.readouterr().out
    assert f"Wrote {job}, {sb}" in printed
    assert f"Run it on 4 ranks:  {sys.executable} -m clusterkernel run -n 4 {job}" in printed
    assert f"or submit it:     sbatch {sb}" in printed

    script = job.read_text()
    assigned = {
        node.targets[0].id: node
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert ast.literal_eval(assigned["factor"].value) == 8
    assert "numpy.ndarray, pickled (protocol 5)" in script  # weights: no literal
    assert "if RANK in (2,):" in script and "auto_sum = float(weights.sum()) * factor" in script
    assert "# In [1] (client only, left out): import numpy as np" in script
    assert f"{sys.executable} -m clusterkernel run -n 4 {job}" in script
    sbatch = sb.read_text()
    assert "#SBATCH --ntasks-per-node=4" in sbatch and "#SBATCH --partition=debug" in sbatch
    assert f"srun --mpi=pmix {sys.executable} {job}" in sbatch
    assert subprocess.run(["bash", "-n", str(sb)]).returncode == 0


def test_export_errors_are_usage_errors(shell, tmp_path):
    # no cluster is needed to refuse: the history alone is wrong
    shell.history_manager.store_inputs(1, "%%mpi\n%timeit sum(range(9))")
    with pytest.raises(UsageError, match=r"In \[1\], line 2: '%timeit sum\(range\(9\)\)'"):
        shell.run_line_magic("mpi", f"export {tmp_path / 'job.py'}")
    assert not (tmp_path / "job.py").exists()
    shell.history_manager.reset()
    shell.history_manager.store_inputs(1, "%mpi push gone")
    with pytest.raises(UsageError, match="no gone in this session"):
        shell.run_line_magic("mpi", f"export {tmp_path / 'job.py'}")


def test_help_is_generated_from_the_parsers(shell, capsys):
    shell.run_cell("%mpi?")
    text = capsys.readouterr().out
    assert "%%mpi start" not in text and "%%mpi pull" not in text and "%%%mpi" not in text
    parsers = [row[0].parser for row in _args.HELP_ROWS if not isinstance(row[0], str)]
    assert {p.prog for p in parsers} >= {"%mpi start", "%mpi pull", "%mpi export", "%%mpi"}
    for parser in parsers:
        options = [o for action in parser._actions for o in action.option_strings]
        assert parser.prog in text
        for option in options:  # every option of every subcommand, e.g. --fault-tolerant
            assert option in text, (parser.prog, option)
    summary = text[text.index("Subcommands:") : text.index("Options of")]
    assert "--fault-tolerant" in summary and "--mpiexec" in summary and "%mpi export" in summary
    for sub in ("stop", "restart", "status", "on", "push", "timeout", "dashboard"):
        assert f"%mpi {sub}" in summary


def test_unknown_subcommand_names_the_nearest_and_help_lists_them(shell, capsys):
    with pytest.raises(UsageError, match=r"^Unknown subcommand 'exprot'. Did you mean 'export'"):
        shell.run_line_magic("mpi", "exprot job.py")
    shell.run_line_magic("mpi", "help")  # the listing the message points to
    assert re.search(r"%mpi export \[[^\n]*--sbatch", capsys.readouterr().out)


def test_export_leaves_out_cells_that_failed(shell, cluster, tmp_path):
    ck_magics._magics.cluster = cluster
    _run(shell, "%%mpi\nkept = 1")
    failed = shell.run_cell("%%mpi\nraise ValueError('typo on every rank')", store_history=True)
    assert not failed.success
    bad_push = shell.run_cell("%mpi push no_such_name", store_history=True)
    assert not bad_push.success
    _run(shell, "%%mpi\nafter = kept + 1")
    _run(shell, f"%mpi export {tmp_path / 'job.py'}")
    script = (tmp_path / "job.py").read_text()
    assert "kept = 1" in script and "after = kept + 1" in script
    assert "typo on every rank" not in script and "no_such_name" not in script.split("# In [3]")[0]
    assert script.count("failed or interrupted in the notebook, left out") == 2
    # kept on request (the failed push of a name that never existed cannot be exported)
    shell.run_cell("no_such_name = 5", store_history=True)
    _run(shell, f"%mpi export {tmp_path / 'all.py'} --include-failed")
    assert "raise ValueError('typo on every rank')" in (tmp_path / "all.py").read_text()


def test_a_pushed_lambda_never_blocks_the_export_and_the_job_runs_it(
    shell, cluster, tmp_path, capfd
):
    ck_magics._magics.cluster = cluster
    _run(shell, "scale = 5\nf = lambda x: x * scale\nmake = lambda k: lambda x: x + k")
    _run(shell, "plus1 = make(1)")
    _run(shell, "%mpi push scale f plus1")  # the ranks take them (ipyparallel pickles code)
    _run(shell, "%%mpi\nprint('f', f(2))")
    # Every rank past its print before any fails: a rank that raises ends the whole job,
    # and a rank still starting up (under load) would print nothing.
    _run(shell, "%%mpi\nfrom mpi4py import MPI\nMPI.COMM_WORLD.Barrier()")
    _run(shell, "%%mpi\nprint('plus1', plus1(2))")
    job = tmp_path / "job.py"
    _run(shell, f"%mpi export {job}")
    script = job.read_text()
    assert "\nf = lambda x: x * scale\n" in script  # its source; it reads the pushed scale
    assert "# plus1: left out, a function:" in script and "closure" in script
    capfd.readouterr()
    # the job runs the lambda; the cell that calls the left-out closure fails, as it said
    assert cli_main(["run", "-n", "2", str(job)]) != 0
    out, err = capfd.readouterr()
    assert sorted(line for line in out.splitlines() if " f " in line) == [
        "[rank 0] f 10",
        "[rank 1] f 10",
    ], out + err
    assert "NameError: name 'plus1' is not defined" in err


# torchrun's variables; MASTER_PORT is a fresh free port at every start, the job's too
TORCHRUN = "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK NODE_RANK GROUP_WORLD_SIZE"
ENV_CELL = (
    "%%mpi\nimport os\n"
    f"print('env', *(f'{{k}}={{os.environ.get(k)}}' for k in {TORCHRUN.split() + ['MASTER_ADDR']}),"
    " 'port', os.environ.get('MASTER_PORT', '').isdigit())"
)


def test_the_job_gets_torchruns_environment_as_the_notebooks_ranks_do(
    shell, cluster, tmp_path, capsys
):
    ck_magics._magics.cluster = cluster
    capsys.readouterr()
    _run(shell, ENV_CELL)
    notebook = sorted(per_rank_lines(capsys.readouterr().out))
    assert (
        0,
        "env RANK=0 LOCAL_RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 GROUP_RANK=0 "
        "NODE_RANK=0 GROUP_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 port True",
    ) in notebook
    job = tmp_path / "job.py"
    _run(shell, f"%mpi export {job}")
    run_line = capsys.readouterr().out.splitlines()[1]
    assert run_line.startswith("Run it on 4 ranks:  "), run_line
    # the printed command, as a user pastes it into a shell without the venv
    proc = subprocess.Popen(
        ["bash", "-c", run_line.split(":  ", 1)[1]],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        raise AssertionError(f"{run_line} hung") from None
    assert proc.returncode == 0, err
    assert sorted(per_rank_lines(out)) == notebook, (out, err)
    assert shlex.split(run_line.split(":  ", 1)[1])[-1] == str(job)
