"""A notebook that trains on 4 ranks, exported and submitted with ``sbatch``, gives
the same per-rank results as the notebook's own run.

The notebook runs for real in a kernel (nbclient) against 4 local MPI ranks; its
export runs as a Slurm batch job over the test bed's two nodes (2 ranks each).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import nbformat
from nbclient import NotebookClient

_TRAIN = """\
import torch
from clusterkernel import comm
from clusterkernel.train import average_gradients

torch.manual_seed(0)
X = torch.randn(256, 8)
y = X @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(256)
mine = slice(comm.rank() * 64, (comm.rank() + 1) * 64)   # this rank's quarter
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(steps):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(X[mine]).squeeze(1), y[mine])
    loss.backward()
    average_gradients(model)
    opt.step()
print(f"RESULT rank={comm.rank()} host_ok loss={loss.item():.5f} w0={model.weight[0, 0].item():.5f}")
"""

_RESULT = re.compile(r"RESULT rank=(\d+) host_ok loss=([\d.]+) w0=(-?[\d.]+)")

# torch.distributed as a torchrun script would use it: the job's ranks get the same
# environment the notebook's had, with LOCAL_RANK counted per node
_TORCH = """\
import os, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"TORCH rank={dist.get_rank()} local={os.environ['LOCAL_RANK']} node={os.environ['NODE_RANK']} sum={t.item()}")
dist.destroy_process_group()
"""
_TORCH_LINE = re.compile(r"TORCH rank=(\d+) local=(\d+) node=(\d+) sum=([\d.]+)")


def _notebook(path: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext clusterkernel"),
        nbformat.v4.new_code_cell("%mpi start -n 4"),
        nbformat.v4.new_code_cell("steps = 40\n%mpi push steps"),
        nbformat.v4.new_code_cell("%%mpi\n" + _TRAIN),
        nbformat.v4.new_code_cell("%%mpi\n" + _TORCH),
        nbformat.v4.new_code_cell("print('a client-only cell')"),
        nbformat.v4.new_code_cell("%mpi stop"),
    ]
    nbformat.write(nb, path)


def _results(text: str) -> dict[int, tuple[str, str]]:
    return {int(r): (loss, w0) for r, loss, w0 in _RESULT.findall(text)}


def test_exported_notebook_as_a_batch_job_matches_the_notebook(
    slurm_testbed, no_shared_cluster, tmp_path
):
    nb_path = str(tmp_path / "train.ipynb")
    _notebook(nb_path)

    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    in_notebook = _results(str(nb.cells[3].outputs))
    assert sorted(in_notebook) == [0, 1, 2, 3], nb.cells[3].outputs

    subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterkernel",
            "export",
            nb_path,
            "-o",
            str(tmp_path / "job.py"),
            "--sbatch",
            str(tmp_path / "job.sbatch"),
            "--nodes",
            "2",
            "--ntasks-per-node",
            "2",
            "--time",
            "0:10:00",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    script = (tmp_path / "job.py").read_text()
    assert "a client-only cell" not in script.split("# ---")[-1] or "left out" in script
    job = (
        subprocess.run(
            ["sbatch", "--parsable", str(tmp_path / "job.sbatch")],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=os.environ,
        )
        .stdout.strip()
        .split(";")[0]
    )
    deadline = time.monotonic() + 180
    while job in slurm_testbed.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job not in slurm_testbed.jobs(), f"batch job {job} still queued after 180 s"
    outs = list(tmp_path.glob(f"*{job}*.out"))
    assert outs, f"no output file of job {job} in {sorted(os.listdir(tmp_path))}"
    text = outs[0].read_text()
    as_job = _results(text)
    # every line labelled by its rank, as in the notebook
    for rank in range(4):
        assert re.search(rf"^\[rank {rank}\] RESULT rank={rank} ", text, re.M), text
    # same numbers; the 4 ranks ran on both nodes this time
    assert as_job == in_notebook, (as_job, in_notebook, text)
    notebook_torch = sorted(set(_TORCH_LINE.findall(str(nb.cells[4].outputs))))
    assert notebook_torch == [(str(r), str(r), "0", "10.0") for r in range(4)], nb.cells[4].outputs
    job_torch = sorted(set(_TORCH_LINE.findall(text)))
    assert job_torch == [("0", "0", "0", "10.0"), ("1", "1", "0", "10.0"),
                         ("2", "0", "1", "10.0"), ("3", "1", "1", "10.0")], text  # fmt: skip
