"""The export of a notebook to a batch job, without MPI: what is kept, dropped, refused."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from clusterkernel.__main__ import main as cli_main
from clusterkernel.client.export import ExportError, export_cells, sbatch_script, write_job


def _assigned(script: str, name: str) -> list[ast.Assign]:
    return [
        node
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == name for t in node.targets)
    ]


def _code(script: str) -> str:
    """The script without its comments."""
    return ast.unparse(ast.parse(script))


def _ranks_guard(script: str, marker: str) -> tuple | None:
    """The ranks of the ``if RANK in (...)`` around the statement printing ``marker``."""
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.If) and "RANK" in ast.unparse(node.test):
            if marker in ast.unparse(node):
                return ast.literal_eval(node.test.comparators[0])
    return None


NOTEBOOK = [
    "%load_ext clusterkernel",
    "%mpi start -n 2",
    "%matplotlib inline\nimport numpy as np",
    "%%mpi\nprint('first')",
    "print('client side')",
    "%%mpi --ranks 0,2 --timeout 30 --noblock --dashboard\nprint('picked')",
    "%mpi status",
    "%mpi dashboard",
    "%%mpi\nprint('last')",
]


def test_rank_cells_kept_in_order_and_client_cells_named_in_comments():
    script = export_cells(NOTEBOOK, source="demo.ipynb")
    order = [script.index(f"print('{word}')") for word in ("first", "picked", "last")]
    assert order == sorted(order)
    assert "print('client side')" not in _code(script)
    # one comment line per dropped cell, with its first line
    for first in (
        "%load_ext clusterkernel",
        "%mpi start -n 2",
        "%matplotlib inline",
        "%mpi status",
    ):
        assert sum(first in line and line.startswith("#") for line in script.splitlines()) == 1
    assert "# cell 5 (client only, left out): print('client side')" in script
    assert "get_ipython" not in script
    assert "demo.ipynb" in script.splitlines()[0] and "-m clusterkernel run -n 2 job.py" in script


def test_ranks_option_guards_the_cell_and_other_options_are_dropped_with_a_comment():
    script = export_cells(NOTEBOOK)
    assert _ranks_guard(script, "picked") == (0, 2)
    assert _ranks_guard(script, "first") is None
    assert "--timeout --noblock --dashboard dropped" in script


def test_indenting_a_ranks_cell_leaves_multiline_strings_as_they_were():
    text = "line one\n  indented\nlast"
    cell = f'%%mpi --ranks 1\ns = """{text}"""\nif True:\n    t = s'
    script = export_cells([cell])
    assert _ranks_guard(script, "t = s") == (1,)
    assert ast.literal_eval(_assigned(script, "s")[0].value) == text


def test_mpi_on_makes_every_cell_a_rank_cell_until_mpi_off():
    cells = [
        "n = 2",
        "%mpi on",
        "print('auto one')",
        "%mpi push n",  # a %mpi cell runs on the client even while %mpi on is in effect
        "%%mpi --ranks 1\nprint('explicit')",
        "%mpi off",
        "print('local again')",
    ]
    script = export_cells(cells)
    assert "print('auto one')" in script and "print('explicit')" in script
    assert "print('local again')" not in _code(script)
    assert [ast.unparse(a) for a in _assigned(script, "n")] == ["n = 2"]
    assert _ranks_guard(script, "explicit") == (1,)


def test_mpi_kernel_notebook_runs_every_cell_on_the_ranks_except_local_and_mpi_cells(tmp_path):
    cells = ["x = 1", "%%local\nimport matplotlib\nlocal_only = 2", "%mpi status", "print(x)"]
    nb = _notebook(tmp_path / "k.ipynb", cells)
    meta = nbformat.read(nb, as_version=4)
    meta.metadata["kernelspec"] = {
        "name": "clusterkernel",
        "display_name": "Python 3 (MPI, 3 ranks)",
    }
    nbformat.write(meta, nb)
    assert cli_main(["export", str(nb), "-o", str(tmp_path / "k.py")]) == 0
    script = (tmp_path / "k.py").read_text()
    assert "x = 1" in _code(script) and "print(x)" in _code(script)
    assert (
        "local_only" not in _code(script)
        and "# code cell 2 (client only, left out): %%local" in script
    )
    assert f"-m clusterkernel run -n 3 {tmp_path / 'k.py'}" in script
    # the same cells from a plain kernel: only %%mpi cells would run on the ranks
    with pytest.raises(ExportError, match="none of the 4 cells runs on the ranks"):
        export_cells(cells)


def test_push_of_a_name_replays_the_statements_that_make_it_and_what_they_need():
    cells = [
        "import math\nbase = 3\nunused = 99",
        "x = [base] * 2\nprint(x)",
        "%mpi push x",
        "%mpi push y=math.sqrt(base) + 1",
        "%%mpi\nprint(x, y)",
    ]
    script = export_cells(cells)
    ns: dict = {}
    pushed = script[script.index("# %% cell 3") : script.index("# %% cell 5")]
    exec(compile(pushed, "pushed", "exec"), ns)  # the lines every rank runs for the pushes
    assert ns["x"] == [3, 3] and ns["y"] == pytest.approx(3**0.5 + 1)
    assert "unused" not in ns and "print(x)" not in pushed


def test_live_pushed_values_are_literals_when_they_round_trip_else_pickles():
    values = {"a": 3, "b": [1, "two", (3.5, None)], "arr": np.arange(4.0), "nan": float("nan")}
    script = export_cells(["%mpi push a b arr nan", "%%mpi\nprint(a)"], pushed=values)
    assert "a = 3" in script and "b = [1, 'two', (3.5, None)]" in script
    ns: dict = {}
    block = script[script.index("# %% cell 1") : script.index("# %% cell 2")]
    exec(compile(block, "pushed", "exec"), ns)
    assert ns["b"] == values["b"] and np.isnan(ns["nan"])
    np.testing.assert_array_equal(ns["arr"], values["arr"])
    assert "pickled (protocol 5)" in block and "numpy.ndarray" in block
    assert "arr = array(" not in block  # repr of an array is no literal: it was pickled


def _closure(k):
    return lambda x: x * k


def test_pushed_values_that_cannot_be_pickled_are_their_source_or_a_comment_never_an_error():
    import threading

    double = lambda x: 2 * x  # noqa: E731  (the lambda is the point)
    values = {"double": double, "times3": _closure(3), "lock": threading.Lock()}
    script = export_cells(["%mpi push double times3 lock", "%%mpi\nprint(double(2))"], values)
    block = script[script.index("# %% cell 1") : script.index("# %% cell 2")]
    assert "double = lambda x: 2 * x\n" in block
    assert "# times3: left out, a function:" in block and "closure" in block
    assert "# lock: left out, a _thread.lock: it cannot be pickled" in block
    ns: dict = {}
    exec(compile(block, "pushed", "exec"), ns)
    assert ns["double"](21) == 42 and "times3" not in ns and "lock" not in ns


@pytest.mark.parametrize(
    "cells, pushed, message",
    [
        (["%mpi push x", "%%mpi\nprint(x)"], None, r"%mpi push x=<expression>.*%mpi export"),
        (["%%mpi\nx = 1\n%time f()"], None, r"cell 1, line 3: '%time f\(\)' is IPython syntax"),
        (["%%mpi\n%%time\nx = 1"], None, r"cell 1.*'%%time' is IPython syntax"),
        (["a = 1", "%%mpi\nfiles = !ls"], None, r"cell 2, line 2: '!ls' is IPython syntax"),
        (["%%mpi\n!echo {x}"], None, r"\{expression\}"),
        (["%%mpi --ranks a,b\npass"], None, r"cell 1: --ranks takes ranks like 0,2"),
        (["%%mpi --bogus\npass"], None, r"cell 1: %%mpi: unrecognized arguments: --bogus"),
        (["%%mpi\ndef f(:\n    pass"], None, r"cell 1, line 2"),
        (["%mpi push g"], {}, r"no value given for pushed 'g'"),
        (["import os", "%mpi start", "print(1)"], None, r"none of the 3 cells runs on the ranks"),
    ],
)
def test_what_a_plain_script_cannot_run_is_a_clear_error(cells, pushed, message):
    with pytest.raises(ExportError, match=message):
        export_cells(cells, pushed)


def test_shell_escapes_run_through_subprocess_and_batch_noop_magics_are_dropped():
    script = export_cells(["%%mpi\n!echo hi\nif True:\n    %matplotlib inline\n    x = 1"])
    assert "_system('echo hi')" in script
    assert "pass  # dropped (nothing to do in a batch job): %matplotlib inline" in script
    assert "subprocess.run(cmd, shell=True" in script


def _bash_n(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_sbatch_file_is_ready_to_submit(tmp_path):
    script = tmp_path / "job.py"
    text = sbatch_script(script, 2, 3, "0-02:30:00", partition="gpu", account="proj-1")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for directive in (
        "--job-name=job",
        "--nodes=2",
        "--ntasks-per-node=3",
        "--time=0-02:30:00",
        "--partition=gpu",
        "--account=proj-1",
        f"--output={tmp_path}/job-%j.out",
    ):
        assert f"#SBATCH {directive}" in lines
    assert lines[-1] == f"srun --mpi=pmix {sys.executable} {script}"
    (tmp_path / "job.sbatch").write_text(text)
    _bash_n(tmp_path / "job.sbatch")
    plain = sbatch_script("job.py")
    assert "--partition" not in plain and "--account" not in plain
    assert f"{Path.cwd() / 'job.py'}" in plain


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"time": "two hours"}, "--time 'two hours'"),
        ({"nodes": 0}, "--nodes must be a positive integer"),
        ({"ntasks_per_node": -1}, "--ntasks-per-node must be a positive integer"),
        ({"partition": "gpu; rm -rf /"}, "--partition"),
    ],
)
def test_sbatch_bad_options_are_clear_errors(kwargs, message):
    with pytest.raises(ExportError, match=message):
        sbatch_script("job.py", **kwargs)


def test_write_job_spreads_the_notebooks_ranks_over_the_nodes(tmp_path):
    written = write_job(
        ["%mpi start -n 6", "%%mpi\npass"], tmp_path / "j.py", sbatch=tmp_path / "j.sbatch", nodes=2
    )
    assert written == [tmp_path / "j.py", tmp_path / "j.sbatch"]
    assert "#SBATCH --ntasks-per-node=3" in written[1].read_text()
    _bash_n(written[1])


def _notebook(path: Path, sources: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A title")]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, path)
    return path


def test_cli_writes_script_and_sbatch(tmp_path, capsys):
    nb = _notebook(tmp_path / "train.ipynb", ["%mpi start -n 4", "k = 5\n%mpi push k", "%%mpi\nk"])
    job, sb = tmp_path / "out" / "job.py", tmp_path / "job.sbatch"
    job.parent.mkdir()
    argv = ["export", str(nb), "-o", str(job), "--sbatch", str(sb), "--time", "10"]
    assert cli_main(argv) == 0
    assert f"Wrote {job}, {sb}" in capsys.readouterr().out
    assert "train.ipynb" in job.read_text() and "k = 5" in job.read_text()
    assert "#SBATCH --ntasks-per-node=4" in sb.read_text() and "#SBATCH --time=10" in sb.read_text()
    assert f"{sys.executable} {job}" in sb.read_text()
    _bash_n(sb)


def test_cli_errors_name_the_code_cell_and_exit_2(tmp_path):
    nb = _notebook(tmp_path / "bad.ipynb", ["%mpi start -n 2", "%mpi push ghost"])
    done = subprocess.run(
        [sys.executable, "-m", "clusterkernel", "export", str(nb)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "code cell 2: %mpi push ghost" in done.stderr
    assert not (tmp_path / "bad.py").exists()
    missing = subprocess.run(
        [sys.executable, "-m", "clusterkernel", "export", str(tmp_path / "nope.ipynb")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_a_notebook_file_exports_without_the_cells_whose_outputs_hold_an_error(tmp_path):
    import nbformat

    from clusterkernel.client.export import read_notebook

    nb = nbformat.v4.new_notebook()
    ok = nbformat.v4.new_code_cell("%%mpi\nx = 1")
    bad = nbformat.v4.new_code_cell("%%mpi\nx = undefined_name")
    bad.outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="x", traceback=[])]
    nb.cells = [nbformat.v4.new_markdown_cell("# a title"), ok, bad]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    cells, ranks, torch, failed = read_notebook(path)
    assert failed == {1} and ranks is None and not torch
    script = export_cells(cells, failed=failed)
    assert "x = 1" in script and "undefined_name" not in script
    assert "cell 2 (failed or interrupted in the notebook, left out)" in script
    assert "undefined_name" in export_cells(cells)


@pytest.mark.parametrize(
    "start, call",
    [
        ("%mpi start -n 2", "prepare_rank()"),
        ("%mpi start -n 2 --gpu-share", "prepare_rank(None, True)"),
        ("%mpi start -n 2 --no-gpu-binding", "prepare_rank(0, False)"),
        ("%mpi start -n 2 --gpus-per-rank 2", "prepare_rank(2, False)"),
    ],
)
def test_every_rank_of_the_job_is_bound_as_the_notebooks_start_asked(start, call):
    # the call that gives the notebook's ranks torchrun's environment and their GPU,
    # whether or not the cells use torch, with the notebook's GPU options
    script = export_cells([start, "%%mpi\nprint('hi')"])
    assert [line for line in script.splitlines() if "prepare_rank(" in line] == [call]
    live = export_cells(["%%mpi\nprint('hi')"], gpus=(1, True))  # the live cluster's
    assert "\nprepare_rank(1, True)\n" in live
