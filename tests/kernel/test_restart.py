"""The kernel menu's interrupt and restart act on the MPI kernel's ranks.

- interrupt (SIGINT to the kernel, as the menu sends it): the running cell ends as
  %%mpi's interrupt handling reports it, and the same ranks run the next cell;
- restart, the way Jupyter Server does it (a shutdown request) and killed outright
  (the kernel gets no chance to clean up: the guard process must stop the ranks):
  the old kernel's ranks and cluster are gone, the next cell starts new ranks.

Only processes this test started are looked at.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel

from tests._kernels import wait_for_files
from tests._procs import cluster_processes, wait_gone

# a cell that runs for two minutes, each rank saying it started with a file in ``{here}``
LOOP = (
    "import pathlib, time\nfrom mpi4py import MPI\n"
    "pathlib.Path({here!r}, str(MPI.COMM_WORLD.Get_rank())).touch()\n"
    "for i in range(1200):\n    time.sleep(0.1)"
)


def _run(kc, code: str, timeout: float = 180) -> tuple[dict, str]:
    """Run a cell; its reply content and all its stdout."""
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def _rank_pids(kc) -> tuple[dict[int, int], str]:
    reply, out = _run(kc, "%mpi status")
    assert reply["status"] == "ok", reply
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    return {int(r[0]): int(r[2]) for r in rows}, out


def _interrupt_running_cell(km, kc, here: Path, ranks: int) -> dict:
    msg_id = kc.execute(LOOP.format(here=str(here)))
    while True:  # the cell is running once the kernel says busy for it
        msg = kc.get_iopub_msg(timeout=60)
        parent = msg["parent_header"].get("msg_id")
        if msg["msg_type"] == "status" and parent == msg_id:
            assert msg["content"]["execution_state"] == "busy"
            break
    wait_for_files([here / str(r) for r in range(ranks)])  # the ranks are in the loop
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    # ipykernel sends an error reply before it stops aborting queued requests; a
    # request sent the instant the reply arrives can be aborted. A front end sends the
    # next cell later; here, wait until the kernel says idle, after the abort is over.
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                break
    return reply["content"]


@pytest.fixture
def kernel(mpi_kernel):
    km, kc = start_new_kernel(kernel_name=mpi_kernel, startup_timeout=60)
    yield km, kc
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def test_interrupt_reaches_the_ranks_and_restart_replaces_them(kernel, tmp_path):
    km, kc = kernel
    pids, out = _rank_pids(kc)  # the first cell that needs ranks starts them
    assert "Starting 2 MPI ranks..." in out and sorted(pids) == [0, 1]

    interrupted = _interrupt_running_cell(km, kc, tmp_path, len(pids))
    assert interrupted["status"] == "error"
    assert interrupted["ename"] == "CellInterrupted", interrupted  # %%mpi's own report
    assert "SIGINT" in interrupted["evalue"], interrupted
    assert _rank_pids(kc)[0] == pids  # the same ranks, freed, run the next cell

    for how in ("shutdown request", "kill"):
        old = cluster_processes()
        assert set(pids.values()) <= {p.pid for p in old}
        # a killed kernel cleans up nothing itself: its guard process must stop the ranks
        assert any("clusterkernel.client.launch._guard" in " ".join(p.cmdline()) for p in old)
        km.restart_kernel(now=(how == "kill"))
        left = wait_gone(old, 30)
        assert not left, f"after a restart ({how}): {[p.cmdline() for p in left]}"
        kc.wait_for_ready(timeout=60)
        new_pids, out = _rank_pids(kc)
        assert "Starting 2 MPI ranks..." in out and sorted(new_pids) == [0, 1]
        assert not set(new_pids.values()) & set(pids.values())
        pids = new_pids

    last = cluster_processes()
    km.shutdown_kernel()
    left = wait_gone(last, 30)
    assert not left, f"after shutdown: {[p.cmdline() for p in left]}"
