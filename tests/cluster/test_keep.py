"""Kept clusters: ranks that outlive the kernel when asked, and the way back to them.

Real kernels (jupyter_client), a real terminal IPython and real ranks. Each test keeps
its clusters in a run directory of its own (``CLUSTERKERNEL_RUN_DIR``), so ``list`` and
``attach`` see only what the test made, never a user's own kept clusters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from clusterkernel import Cluster
from clusterkernel.client.cluster import _kept_records
from clusterkernel.client.errors import ClusterError
from tests._kernels import wait_for_files, wait_until
from tests._procs import cluster_processes, wait_no_cluster_processes
from tests.kernel.test_completion import _shown
from tests.kernel.test_restart import _run


@pytest.fixture
def runs(tmp_path, monkeypatch) -> str:
    root = tmp_path / "runs"
    root.mkdir(mode=0o755)  # others may look in; the run directories inside are 0700
    monkeypatch.setenv("CLUSTERKERNEL_RUN_DIR", str(root))
    yield str(root)
    for record in _kept_records.kept():  # what a failed test kept: stopped, or it would stay
        if not record.get("ended"):
            try:
                Cluster.attach(record["id"], force=True).stop()
            except ClusterError:
                pass


@pytest.fixture
def kernels():
    started = []

    def start(name: str = "python3"):
        km, kc = start_new_kernel(kernel_name=name, startup_timeout=60)
        started.append((km, kc))
        return km, kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def _ok(kc, code: str) -> str:
    reply, out = _run(kc, code)
    assert reply["status"] == "ok", (reply, out)
    return out


def _error(kc, code: str) -> str:
    reply, _ = _run(kc, code)
    assert reply["status"] == "error", reply
    return f"{reply['ename']}: {reply['evalue']}"


def _rank_pids() -> set[int]:
    """The ranks' engine processes (not their nannies, not prterun)."""
    engines = (["-m", "ipyparallel.engine"], ["-m", "clusterkernel.rank._warm_start"])
    return {p.pid for p in cluster_processes() if p.cmdline()[1:3] in engines}


def _started_and_killed(cluster_args: str, then: str = "") -> str:
    """A process (a "kernel") that starts ``Cluster(n=2, <cluster_args>)``, runs ``then``
    on the ranks and dies of SIGKILL; the cluster's run directory."""
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "from clusterkernel import Cluster; import sys\n"
         f"c = Cluster(n=2{cluster_args}).start()\n"
         f"if {then!r}: c.run({then!r})\n"
         "print(c.run_dir, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = starter.stdout.readline().strip()
    starter.kill()
    starter.wait()
    return run_dir


def _gone(run_dir: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(run_dir) and not cluster_processes():
            return True
        time.sleep(0.25)
    return False


def _gone_but_the_kernel(timeout: float) -> bool:
    """No cluster process is left but the MPI kernel itself (it runs on, ranks stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = [p for p in cluster_processes() if "clusterkernel.client.kernel" not in p.cmdline()]
        if not procs:
            return True
        time.sleep(0.25)
    return False


def test_bad_keep_values_are_refused_at_once():
    # refused while the Cluster is made, before anything starts (tests/_spawn_check fails
    # this unmarked test if a rank or a kernel starts)
    for bad in ("-1", "soon", "0", "2x", "", "nan"):
        with pytest.raises(ValueError, match="keep takes a duration such as 90s, 30m, 2h"):
            Cluster(n=2, keep=bad)
    assert _kept_records.parse_keep("1h30m") == 5400
    assert _kept_records.parse_keep("90s") == _kept_records.parse_keep(90) == 90
    assert _kept_records.parse_keep(True) == _kept_records.parse_keep("forever") == float("inf")
    assert _kept_records.parse_keep(None) is None and _kept_records.parse_keep(False) is None


def test_attach_to_nothing_or_a_wrong_id_says_so(runs):
    with pytest.raises(ClusterError, match="No kept cluster to attach"):
        Cluster.attach()
    with pytest.raises(ClusterError, match="No kept cluster 'nope' of yours"):
        Cluster.attach("nope")
    out = subprocess.run(
        [sys.executable, "-m", "clusterkernel", "list"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "No kept clusters" in out.stdout, out


def test_a_killed_kernel_keeps_its_ranks_and_a_terminal_ipython_attaches(
    runs, kernels, no_shared_cluster
):
    km, kc = kernels()
    _ok(kc, "%load_ext clusterkernel")
    said = _ok(kc, "%mpi start -n 2 --keep 1h")
    assert "kept until" not in said and "kept 1h without a session as cluster" in said, said
    _ok(
        kc,
        "%%mpi\nimport clusterkernel\nfrom mpi4py import MPI\n"
        "zz_kept = 100 + MPI.COMM_WORLD.rank\nclusterkernel.log(step=0, loss=1.5)",
    )
    ranks = _rank_pids()
    assert len(ranks) == 2
    [record] = _kept_records.kept()
    assert record["attached"] and record["client"]["pid"] == km.provisioner.process.pid

    os.kill(km.provisioner.process.pid, signal.SIGKILL)  # a kernel that died outright
    # the guard has seen the kernel gone: from here it keeps the ranks
    wait_until(lambda: not _kept_records.kept()[0]["attached"], 60, "the kernel seen gone")
    assert _rank_pids() == ranks, "the kept ranks did not outlive the kernel"

    # a terminal IPython on the same machine: list, attach (no id: there is one), use, stop
    script = textwrap.dedent("""\
        %load_ext clusterkernel
        %mpi list
        %mpi attach
        pulled = %mpi pull zz_kept
        print("pulled", pulled)
        from clusterkernel.client.magics import current_cluster
        dash = current_cluster().dashboard()
        dash.sync()
        print("history", sorted((r["rank"], r["values"]["loss"]) for r in dash.records("scalar")))
        %mpi stop
    """)
    out = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "--quick",
         "--HistoryManager.enabled=False"],
        input=script, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"{record['id']}" in out.stdout and "none" in out.stdout, out.stdout
    assert f"Attached to 2 MPI ranks (cluster {record['id']})" in out.stdout, out
    assert "pulled {0: 100, 1: 101}" in out.stdout, out
    # the dashboard shows what the ranks logged before the kernel died
    assert "history [(0, 1.5), (1, 1.5)]" in out.stdout, out
    assert _gone(record["run_dir"], 15), "attach + stop left processes or files"


def test_a_short_keep_expires_and_removes_everything(runs, no_shared_cluster):
    shm_before = set(os.listdir("/dev/shm"))
    # a shared-memory window on each rank: its /dev/shm file must go too
    run_dir = _started_and_killed(
        ", keep='5s'", "from clusterkernel import comm; w = comm.shm_empty((1024,))"
    )
    shm_job = set(os.listdir("/dev/shm")) - shm_before
    assert shm_job, "the ranks made no shared-memory file: nothing to check"
    # the guard has seen its client gone (idle since then): the keep time starts, the
    # ranks are still there
    wait_until(lambda: _kept_records.kept()[0].get("idle_since"), 60, "the client seen gone")
    assert cluster_processes()
    assert _gone(run_dir, 20), "the keep time passed and something was left"
    assert _kept_records.kept() == []
    assert not shm_job & set(os.listdir("/dev/shm")), "the job's /dev/shm files were left"


def test_one_driver_at_a_time_and_a_takeover_while_a_cell_runs(
    runs, kernels, no_shared_cluster, tmp_path
):
    _, first = kernels()
    _ok(first, "%load_ext clusterkernel")
    _ok(first, "%mpi start -n 2 --keep 10m")
    _ok(first, "%%mpi\nzz_before = 7")
    # the cell runs (the file `started`) until the second session has said it still runs
    # (the file `release`; at most 2 minutes)
    started, release = tmp_path / "started", tmp_path / "release"
    running = first.execute(
        "%%mpi\nimport os, pathlib, time\nprint('step', 0, flush=True)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        f"for _ in range(2400):\n    if os.path.exists({str(release)!r}):\n        break\n"
        "    time.sleep(0.05)\nfor i in range(1, 5):\n    print('step', i, flush=True)\n"
        "zz_after = 8"
    )
    wait_for_files([started])

    km2, second = kernels()
    _ok(second, "%load_ext clusterkernel")
    refused = _error(second, "%mpi attach")
    assert "attached to another session" in refused and "--force" in refused, refused

    shown: list[str] = []

    def hook(msg) -> None:  # the cell goes on once the new session says it still runs
        content = msg["content"]
        if msg["msg_type"] == "stream":
            shown.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            shown.extend(str(v) for k, v in content["data"].items() if k.startswith("text/"))
        if "still running a cell" in "".join(shown):
            release.touch()

    try:  # shows the running cell until it ends
        reply = second.execute_interactive("%mpi attach --force", timeout=180, output_hook=hook)
    finally:
        release.touch()
    said = "".join(shown)
    assert reply["content"]["status"] == "ok", (reply["content"], said)
    assert "Took cluster" in said and "that session is told at its next call" in said, said
    assert "Ranks 0-1 still running a cell sent before this session attached" in said, said
    assert "step 4" in said, f"the running cell's output did not reach the new session: {said}"
    # the new driver's cell waits for the running one and sees what it made
    assert "zz 7 8" in _shown(second, "%%mpi --ranks 0\nprint('zz', zz_before, zz_after)")

    while True:  # the first kernel's cell ends (its result went to a client that let go)
        msg = first.get_shell_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == running:
            break
    told = _error(first, "%%mpi\nprint(1)")
    assert "took this kept cluster over" in told, told
    _ok(first, "%mpi stop")  # harmless: it no longer drives the ranks
    assert len(_rank_pids()) == 2
    _ok(second, "%mpi stop")
    assert not wait_no_cluster_processes(20)


def test_the_mpi_kernel_with_keep_attaches_again_after_a_restart(
    runs, kernels, tmp_path, no_shared_cluster
):
    # no_shared_cluster: the MPI kernel starts ranks of its own (one cluster at a time)
    prefix = tmp_path / "prefix"
    subprocess.run(
        [sys.executable, "-m", "clusterkernel", "install-kernel", "-n", "2", "--keep", "5m",
         "--name", "ck-keep", "--prefix", str(prefix)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    try:
        km, kc = kernels("ck-keep")
        _ok(kc, "zz_model_state = 5")
        ranks = _rank_pids()
        km.restart_kernel(now=False)  # the kernel menu's restart: a clean shutdown first
        kc.wait_for_ready(timeout=60)
        out = _shown(kc, "print('again', zz_model_state)")
        assert "Attached to 2 MPI ranks" in out and "again 5" in out, out
        assert _rank_pids() == ranks
        _ok(kc, "%mpi stop")
        assert _gone_but_the_kernel(20), [p.cmdline() for p in cluster_processes()]
    finally:
        del os.environ["JUPYTER_PATH"]


def test_another_users_cluster_is_neither_listed_nor_attached(runs, no_shared_cluster):
    # A second Unix user cannot run this machine's Python (it lives under /root, 0700),
    # so the other user's cluster is made by ownership: a copy of a real record, chowned.
    with Cluster(n=2, keep="10m") as cluster:
        assert os.stat(cluster.run_dir).st_mode & 0o777 == 0o700
        assert os.stat(_kept_records.record_path(cluster.run_dir)).st_mode & 0o777 == 0o600
        record = _kept_records.read(cluster.run_dir)
        theirs = os.path.join(runs, "cluster-theirs")
        os.mkdir(theirs, 0o700)
        _kept_records.write(theirs, {**record, "id": "theirs", "run_dir": theirs, "uid": 65534})
        os.chown(_kept_records.record_path(theirs), 65534, 65534)
        os.chown(theirs, 65534, 65534)
        # and one of ours that others could read: not trusted either
        loose = os.path.join(runs, "cluster-loose")
        os.mkdir(loose, 0o700)
        _kept_records.write(loose, {**record, "id": "loose", "run_dir": loose})
        os.chmod(loose, 0o755)

        assert [r["id"] for r in _kept_records.kept()] == [cluster.id]
        for other in ("theirs", "loose"):
            with pytest.raises(ClusterError, match=f"No kept cluster '{other}' of yours"):
                Cluster.attach(other)
        assert cluster.pull("__name__")  # ours, still running


def test_ranks_that_die_while_no_one_is_attached_are_reported_once_then_removed(
    runs, no_shared_cluster
):
    run_dir = _started_and_killed(", keep='10m'")
    os.kill(sorted(_rank_pids())[0], signal.SIGKILL)  # MPI ends the whole job
    deadline = time.monotonic() + 30
    while not (_kept_records.kept() or [{}])[0].get("ended") and time.monotonic() < deadline:
        time.sleep(0.5)
    [record] = _kept_records.kept()
    assert record["ended"].startswith("the MPI job ended (killed by SIGKILL"), record
    assert not wait_no_cluster_processes(20)
    with pytest.raises(ClusterError, match="ended while no one was attached: the MPI job ended"):
        Cluster.attach(record["id"])
    assert not os.path.exists(run_dir) and _kept_records.kept() == []


def test_a_kept_cluster_killed_with_its_guard_is_listed_as_ended_not_live(runs, no_shared_cluster):
    """Everything SIGKILLed at once, its guard too (a machine's or a test bed's teardown):
    nothing wrote the end in its record. Listing finds the guard gone and the job ended,
    so attaching without an id is not confused by it, and what it left is removed."""
    run_dir = _started_and_killed(", keep='10m'")
    [record] = _kept_records.kept()
    assert not record["ended"] and record["guard_pid"]
    victims = [psutil.Process(record["guard_pid"]), *cluster_processes()]
    for proc in victims:
        proc.kill()
    psutil.wait_procs(victims, timeout=10)
    [record] = _kept_records.kept()
    assert record["ended"].endswith("and its guard had gone"), record
    with pytest.raises(ClusterError, match="No kept cluster to attach"):
        Cluster.attach()
    with pytest.raises(ClusterError, match="ended while no one was attached"):
        Cluster.attach(record["id"])
    assert not os.path.exists(run_dir) and _kept_records.kept() == []
    assert not wait_no_cluster_processes(5)
