"""What a cluster leaves behind: nothing once stop() returns (nannies included),
and nothing that Jupyter's ipyparallel server extension would adopt and log about.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import psutil

from clusterkernel import Cluster
from tests._procs import alive


def test_stop_after_restart_returns_when_every_process_is_gone(no_shared_cluster):
    cluster = Cluster(n=2).start()
    try:
        cluster.restart()
        pids = cluster.processes()
        procs = [psutil.Process(p) for p in pids]
        names = {p.name() for p in alive(procs)}
        assert any("python" in n for n in names), names  # engines and nannies among them
        assert len(pids) >= 5  # controller, mpiexec, 2 engines, 2 nannies, guard ...
    finally:
        cluster.stop()
    assert alive(procs) == [], [p.cmdline() for p in alive(procs)]


def test_stop_ends_a_process_the_ranks_left_outside_their_tree(no_shared_cluster, tmp_path):
    # what an engine's nanny becomes when its engine is gone: an orphan no launcher's
    # process tree reaches; the cluster's mark in its environment still names it
    cluster = Cluster(n=2).start()
    try:
        cluster.run(
            "import subprocess\n"
            "subprocess.run(['setsid', 'sh', '-c', 'sleep 300 & echo $! > orphan.pid'], "
            f"check=True, cwd={str(tmp_path)!r})",
            ranks=[1],
        )
        pid = int((tmp_path / "orphan.pid").read_text())
        orphan = psutil.Process(pid)
        assert orphan.ppid() != os.getpid() and pid not in cluster.processes()
    finally:
        cluster.stop()
    assert alive([orphan]) == [], orphan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the server printed in a user's terminal while a cluster ran (issue 14, item 7).
_NOISE = re.compile(
    r"Monitor message without topic|No heartbeat|Output for ipcontroller|ipcontroller-|cluster-\d"
)


def test_a_jupyter_servers_log_stays_clean_while_a_cluster_runs(no_shared_cluster, tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "server",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.token=",
            "--ServerApp.ip=127.0.0.1",
            "--allow-root",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "JUPYTER_PLATFORM_DIRS": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while "is running at" not in (tmp_path / "server.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, (
                tmp_path / "server.log"
            ).read_text()
            time.sleep(0.2)
        text = (tmp_path / "server.log").read_text()
        assert "ipyparallel" in text.lower(), (
            "the ipyparallel extension did not load: the test would prove nothing\n" + text
        )
        with Cluster(n=2) as cluster:
            cluster.run("x = 1", renderer=_Silent())
            # What JupyterLab's "IPython Clusters" panel does while it is open: the
            # extension reloads every cluster file it finds on each request.
            ours = []
            for _ in range(8):
                time.sleep(1)
                ours += [c for c in _list_clusters(port) if cluster.run_dir in c]
            assert not ours, f"the server adopted clusterkernel's cluster: {ours[:1]}"
        time.sleep(2)
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()
    text = (tmp_path / "server.log").read_text()
    noise = [ln for ln in text.splitlines() if _NOISE.search(ln)]
    assert not noise, "\n".join(noise)


def _list_clusters(port: int) -> list[str]:
    """The cluster files the ipyparallel server extension lists (its REST API)."""
    url = f"http://127.0.0.1:{port}/ipyparallel/clusters"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return [json.dumps(c) for c in json.load(reply)]


class _Silent:
    def update(self, rank, out): ...
    def notice(self, text): ...
    def finish(self): ...


def test_guard_removes_the_run_dir_of_a_starter_that_died_while_stopping(tmp_path):
    # ipyparallel had removed the cluster file, then the notebook died before it
    # removed its run directory: the guard (EOF without "stopped") removes it.
    run_dir = tmp_path / "cluster-x"
    (run_dir / "security").mkdir(parents=True)
    (run_dir / "stack-rank0.txt").write_text("")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterkernel.client.launch._guard",
            str(run_dir / "security" / "gone.json"),
            str(run_dir),
        ],
        input=b"",
        check=True,
        timeout=60,
    )
    assert not run_dir.exists()
