"""The shared MPI test runner: output comes back, failures and hangs fail with the output."""

from __future__ import annotations

import time

import psutil
import pytest

from tests._mpirun import run_mpi

_REPORT = "from clusterkernel import comm; print('rank', comm.rank(), 'of', comm.size())"


def _procs_running(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_every_rank_runs_and_output_comes_back():
    out = run_mpi(3, "-c", _REPORT, tag_output=True).stdout
    for r in range(3):
        assert f"rank {r} of 3" in out, out


def test_failing_rank_fails_the_test_with_its_output():
    script = "from clusterkernel import comm; import sys; " + (
        "sys.exit('rank one gave up') if comm.rank() == 1 else None"
    )
    with pytest.raises(pytest.fail.Exception) as info:
        run_mpi(2, "-c", script, timeout=60)
    assert "exited" in str(info.value) and "rank one gave up" in str(info.value)


def test_hang_is_killed_with_every_rank(tmp_path):
    # A marker in argv lets us find exactly this job's ranks afterwards.
    marker = f"ck-hang-{tmp_path.name}"
    script = f"import time; print('started', flush=True); time.sleep(600)  # {marker}"
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as info:
        run_mpi(2, "-c", script, timeout=8)
    assert time.monotonic() - start < 60
    assert "hung (> 8 s)" in str(info.value)
    assert "started" in str(info.value), "output printed before the hang is shown"
    deadline = time.monotonic() + 10
    while _procs_running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _procs_running(marker), "ranks outlived the killed job"
