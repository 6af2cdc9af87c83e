"""An exported notebook runs as a plain MPI job: real ``mpiexec -n 2``, real torch collectives.

Run under the machine-wide lock (it starts MPI ranks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

from clusterkernel.__main__ import main as cli_main
from clusterkernel.client.mpiexec import MPIRuntime
from tests._mpirun import run_mpi, run_session

CELLS = [
    "%load_ext clusterkernel",
    "%mpi start -n 2",
    "%matplotlib inline",
    "base = 10\nscale = base * 3",
    "%mpi push scale",
    "%%mpi\n"
    "import torch\n"
    "from clusterkernel import comm\n"
    "t = torch.tensor([float(comm.rank() + 1)])\n"
    "comm.all_reduce(t)\n"
    "print('sum', t.item(), 'scaled', t.item() * scale)",
    "%%mpi --ranks 1 --timeout 60\nprint('only on', comm.rank())\nprint('multi\\nline')",
    "%mpi status",
    "%%mpi\nimport sys\nprint('to stderr', file=sys.stderr)\nprint('done', comm.rank())",
]


def _export(tmp_path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, tmp_path / "demo.ipynb")
    script = tmp_path / "job.py"
    assert cli_main(["export", str(tmp_path / "demo.ipynb"), "-o", str(script)]) == 0
    return script


def test_exported_notebook_runs_on_two_ranks_with_labelled_lines(tmp_path):
    script = _export(tmp_path, CELLS)
    out = run_mpi(2, str(script), timeout=180)
    lines = out.stdout.splitlines()
    for rank in (0, 1):
        # 1 + 2 summed over the ranks, times the pushed scale (30)
        assert f"[rank {rank}] sum 3.0 scaled 90.0" in lines
        assert f"[rank {rank}] done {rank}" in lines
        assert f"[rank {rank}] to stderr" in out.stderr.splitlines()
    assert "[rank 1] only on 1" in lines and "[rank 1] multi" in lines and "[rank 1] line" in lines
    assert not any("only on" in line for line in lines if line.startswith("[rank 0]"))
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines if line.strip())


# a shell where the venv is not activated: neither its python nor its mpiexec is on PATH
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}


def _printed_lines(script: Path) -> list[str]:
    """The commands of the job's header ("# Run it on 2 ranks:  <command>", ...)."""
    header = script.read_text().split("\n\n", 1)[0].splitlines()
    return [line.split(":", 1)[1].strip() for line in header[1:3]]


def _run_as_printed(line: str, cwd: Path) -> tuple[int, str, str]:
    """``line`` run by bash in a bare environment from ``cwd``: (status, stdout, stderr)."""
    proc = run_session(["bash", "-c", line], what=line, cwd=cwd, env=BARE_ENV)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_run_lines_the_job_prints_run_as_printed_without_the_venv(tmp_path):
    # as root too (--allow-run-as-root), from another folder, with the venv not activated
    cells = [
        "%mpi start -n 2",
        "%%mpi\nfrom mpi4py import MPI\nprint('of', MPI.COMM_WORLD.Get_size())",
    ]
    script = _export(tmp_path, cells)
    wrapper, by_hand = _printed_lines(script)
    assert wrapper == f"{sys.executable} -m clusterkernel run -n 2 {script}"
    assert by_hand.startswith(MPIRuntime.detect().mpiexec) and "--oversubscribe" in by_hand
    assert ("--allow-run-as-root" in by_hand) == (os.geteuid() == 0)
    (tmp_path / "elsewhere").mkdir()
    for line in (wrapper, by_hand):
        status, out, err = _run_as_printed(line, tmp_path / "elsewhere")
        assert status == 0, f"{line}\n{out}\n{err}"
        assert sorted(out.splitlines()) == ["[rank 0] of 2", "[rank 1] of 2"], err


def test_a_rank_that_raises_ends_the_job_with_its_labelled_traceback(tmp_path):
    cells = [
        "%mpi start -n 2",
        "%%mpi\nfrom clusterkernel import comm",
        "%%mpi --ranks 1\nraise ValueError('boom on one rank')",
        "%%mpi\ncomm.barrier()  # rank 0 waits here for rank 1, which is gone\nprint('never')",
    ]
    script = _export(tmp_path, cells)
    # clusterkernel run, as the job's first line prints it, ends with the job's failure
    status, out, err = _run_as_printed(_printed_lines(script)[0], tmp_path)
    assert status != 0
    assert "[rank 1] ValueError: boom on one rank" in err.splitlines()
    assert "[rank 1] Traceback (most recent call last):" in err.splitlines()
    assert "never" not in out


def test_a_torch_distributed_notebook_runs_as_the_same_job(tmp_path):
    # %mpi start --torch made the group in the notebook; the job makes it the same way,
    # and plain init_process_group code finds torchrun's environment
    cells = [
        "%load_ext clusterkernel",
        "%mpi start -n 2 --torch",
        "%%mpi\n"
        "import os, torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\n"
        "net = DDP(torch.nn.Linear(4, 1))\n"
        "x = torch.ones(2, 4) * (dist.get_rank() + 1)\n"
        "net(x).sum().backward()\n"
        "grad = net.module.weight.grad[0, 0].item()\n"
        "print('env', os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], dist.get_backend())\n"
        "print('grad', grad)",
    ]
    script = _export(tmp_path, cells)
    out = run_mpi(2, str(script), timeout=180)
    lines = out.stdout.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}] env {rank} 2 gloo" in lines, out.stdout
        # DDP averaged the gradients: (2 * 1 + 2 * 2) / 2 = 3 on both ranks
        assert f"[rank {rank}] grad 3.0" in lines, out.stdout
    assert "destroy_process_group" not in out.stderr  # destroyed at exit: no warning
