"""Kernel mode in a real IPython shell, no ranks: which cells go to the ranks, %%local.

Nothing here starts MPI: only the transformation of cells and cells that run locally.
"""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from clusterkernel.client.kernel import kernel_mode
from clusterkernel.client.magics._subcommands import auto_mpi as _auto_mpi


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext clusterkernel")
    saved = list(sh.input_transformers_cleanup)
    yield sh
    sh.input_transformers_cleanup[:] = saved
    sh.magics_manager.registry["MPIMagics"].autostart = None


def test_kernel_mode_sends_cells_to_the_ranks_but_local_and_mpi_magics(shell):
    kernel_mode(shell, 3)
    assert shell.magics_manager.registry["MPIMagics"].autostart == "-n 3"
    assert shell.transform_cell("x = 1\n").startswith("get_ipython().run_cell_magic('mpi', ''")
    assert (
        shell.transform_cell("%mpi status\n") == "get_ipython().run_line_magic('mpi', 'status')\n"
    )
    assert "'--ranks 0'" in shell.transform_cell("%%mpi --ranks 0\nx = 1\n")
    assert shell.transform_cell("%%local\nx = 1\n") == "x = 1\n"
    assert shell.transform_cell("\n") == "\n"  # an empty cell starts no ranks


def test_a_torch_kernel_starts_its_ranks_with_the_group(shell, tmp_path):
    from clusterkernel.client.export import read_notebook
    from clusterkernel.client.kernel import display_name, kernel_spec

    kernel_mode(shell, 2, torch=True)
    assert shell.magics_manager.registry["MPIMagics"].autostart == "-n 2 --torch"
    spec = kernel_spec(2, torch=True)
    assert spec["argv"][-3:] == ["--ranks", "2", "--torch"]
    assert (
        spec["display_name"]
        == display_name(2, True)
        == "Python 3 (MPI, 2 ranks, torch.distributed)"
    )
    # its notebooks export to a job that makes the group too
    nb = tmp_path / "t.ipynb"
    nb.write_text(
        '{"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [],'
        ' "execution_count": null}], "metadata": {"kernelspec": {"display_name":'
        ' "Python 3 (MPI, 2 ranks, torch.distributed)", "name": "ck"}}, "nbformat": 4,'
        ' "nbformat_minor": 5}'
    )
    assert read_notebook(nb) == (["x = 1"], 2, True, set())


def test_local_cells_run_here_with_their_value_and_their_error(shell):
    kernel_mode(shell, 2)
    result = shell.run_cell("%%local\nlocal_value = 6 * 7\nlocal_value", store_history=True)
    assert result.success and result.result == 42
    assert shell.user_ns["local_value"] == 42
    failed = shell.run_cell("%%local\n1 / 0")
    assert not failed.success and isinstance(failed.error_in_exec, ZeroDivisionError)


def test_local_magic_under_mpi_on_runs_the_cell_here(shell):
    # %mpi on's transformer leaves %%local cells to the %%local magic
    shell.input_transformers_cleanup.append(_auto_mpi)
    assert shell.transform_cell("y = 2\n").startswith("get_ipython().run_cell_magic('mpi'")
    shell.run_cell("%%local\nmagic_value = 'here'")
    assert shell.user_ns["magic_value"] == "here"
    assert _auto_mpi in shell.input_transformers_cleanup  # put back after the cell
