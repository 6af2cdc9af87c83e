"""``%mpi export --profile`` / ``clusterkernel export --profile``: a batch job profiles every rank.

The exported job runs under real ``mpiexec -n 2``; what it writes is read back as
speedscope and Chrome trace documents. No timing is asserted: only which of the
job's functions and lines the files name. Run under the machine-wide lock.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jsonschema
import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel.__main__ import main as cli_main
from clusterkernel.client.mpiexec import MPIRuntime
from tests._mpirun import run_mpi, run_session
from tests.cluster.test_profile import SPEEDSCOPE_SHAPE

# ``busy`` spins on every rank, so both ranks' profiles hold it; the last cell says
# whether the profile's sampler thread is running
CELLS = [
    "%mpi start -n 2",
    "%%mpi\n"
    "import threading, time\n"
    "def busy(seconds):\n"
    "    end = time.perf_counter() + seconds\n"
    "    while time.perf_counter() < end:\n"
    "        pass",
    "%%mpi --profile\nbusy(0.3)",
    "%%mpi\n"
    "print('sampler', any(t.name == 'clusterkernel-profile' for t in threading.enumerate()))",
]


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    sh.history_manager.reset()  # %mpi export reads the history: start it empty
    ck_magics._magics.failed_cells.clear()
    yield sh
    sh.history_manager.reset()


def _notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)
    return path


def _busy_lines(script: Path) -> set[int]:
    """The line numbers of ``busy``'s body in the exported script."""
    lines = script.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("def busy("))
    return {start + 1, start + 2, start + 3}


def _check_files(stem: Path, script: Path, ranks: list[int]) -> None:
    """``stem``.speedscope.json and .trace.json hold one profile per rank of ``ranks``,
    each naming ``busy`` at a line of its body in ``script``."""
    doc = json.loads(stem.with_name(stem.name + ".speedscope.json").read_text())
    jsonschema.validate(doc, SPEEDSCOPE_SHAPE)
    frames = doc["shared"]["frames"]
    by_name = {p["name"]: p for p in doc["profiles"]}
    assert set(by_name) == {f"rank {r}" for r in ranks}, list(by_name)
    for prof in by_name.values():
        assert len(prof["samples"]) == len(prof["weights"])
        seen = {i for sample in prof["samples"] for i in sample}
        assert all(0 <= i < len(frames) for i in seen)
        busy = [frames[i] for i in seen if frames[i]["name"] == "busy"]
        assert busy and all(Path(f["file"]) == script for f in busy), busy
        assert {f["line"] for f in busy} <= _busy_lines(script), busy

    trace = json.loads(stem.with_name(stem.name + ".trace.json").read_text())
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {r: f"rank {r}" for r in ranks}
    complete = [e for e in events if e["ph"] == "X"]
    for e in complete:
        assert {"name", "pid", "tid", "ts", "dur"} <= set(e) and e["dur"] >= 0, e
    busy_boxes = [e for e in complete if e["name"] == "busy"]
    assert {e["pid"] for e in busy_boxes} == set(ranks)
    assert all(Path(e["args"]["file"]) == script for e in busy_boxes)


def test_mpi_export_profile_writes_one_speedscope_and_one_trace_of_every_rank(shell, tmp_path):
    for i, cell in enumerate(CELLS, 1):
        shell.history_manager.store_inputs(i, cell)
    script = tmp_path / "job.py"
    shell.run_line_magic("mpi", f"export {script} --profile")
    text = script.read_text()
    assert "_ck_profile.start(torch=False)" in text
    assert "# (--profile dropped: export with --profile to profile the whole job)" in text
    out = run_mpi(2, str(script), cwd=tmp_path, timeout=120).stdout.splitlines()
    assert "[rank 0] sampler True" in out and "[rank 1] sampler True" in out
    wrote = f"[rank 0] profile: {tmp_path / 'job.speedscope.json'}, {tmp_path / 'job.trace.json'}"
    assert wrote in out, out
    _check_files(tmp_path / "job", script, [0, 1])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "job.py",
        "job.speedscope.json",
        "job.trace.json",
    ]


def test_without_profile_no_sampler_runs_and_nothing_is_written(tmp_path):
    script = tmp_path / "job.py"
    nb = _notebook(tmp_path / "nb.ipynb", CELLS)
    assert cli_main(["export", str(nb), "-o", str(script)]) == 0
    assert "_ck_profile" not in script.read_text()
    out = run_mpi(2, str(script), cwd=tmp_path, timeout=120).stdout.splitlines()
    assert "[rank 0] sampler False" in out and "[rank 1] sampler False" in out
    assert not any("profile" in line for line in out), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "nb.ipynb"]


def test_a_rank_that_raises_writes_its_own_profile_before_the_job_ends(tmp_path):
    cells = [*CELLS[:2], "%%mpi\nbusy(0.3)\nif comm_rank == 1:\n    raise ValueError('boom')"]
    cells.insert(2, "%%mpi\nfrom mpi4py import MPI\ncomm_rank = MPI.COMM_WORLD.Get_rank()")
    script = tmp_path / "job.py"
    nb = _notebook(tmp_path / "nb.ipynb", cells)
    assert cli_main(["export", str(nb), "-o", str(script), "--profile"]) == 0
    proc = run_session(
        [sys.executable, "-m", "clusterkernel", "run", "-n", "2", str(script)],
        what="the job",
        cwd=tmp_path,
        env={**MPIRuntime.detect().env(), "OMP_NUM_THREADS": "1"},
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode != 0
    assert "[rank 1] ValueError: boom" in err.splitlines(), err
    assert f"[rank 1] profile: {tmp_path / 'job.rank1.speedscope.json'}" in out, out
    _check_files(tmp_path / "job.rank1", script, [1])
    assert not (tmp_path / "job.speedscope.json").exists()  # no gather: the job ended first
    assert os.path.getsize(tmp_path / "job.rank1.trace.json") > 0
