"""``%mpi sync`` across two hosts: a network namespace on this machine plays the second
host (tests/_netns.py, as in test_multi_host.py). Each host gets its own copy, written
by one of its ranks into its own sync directory, and its ranks import that copy."""

from __future__ import annotations

import os
import socket

from clusterkernel import Cluster
from clusterkernel.client.sync import sync
from tests._netns import ssh_agent, two_host_env
from tests._procs import wait_no_cluster_processes


def test_each_host_gets_its_copy_and_its_ranks_import_it(no_shared_cluster, netns_host, tmp_path):
    pkg = tmp_path / "nb" / "hostpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def where():\n    return __file__\n\nVERSION = 1\n")
    env = two_host_env(netns_host, ssh_agent(tmp_path / "ssh", netns_host))
    here = socket.gethostname()
    cluster = Cluster(n=4, hosts=f"{here}:2,{netns_host.ns_ip}:2", env=env, start_timeout=60)
    cluster.start()
    try:
        first = sync(cluster, [pkg], cwd=tmp_path / "nb")
        assert sorted(first.hosts) == sorted([here, netns_host.hostname])
        assert {h: os.path.basename(d) for h, d in first.hosts.items()} == {
            here: here,
            netns_host.hostname: netns_host.hostname,
        }
        size = (pkg / "__init__.py").stat().st_size
        assert first.bytes == 2 * size  # one copy to each host, over the connection
        cluster.run("import hostpkg\nf = hostpkg.where()")
        expect = {
            r: os.path.join(first.hosts[here if r < 2 else netns_host.hostname], "hostpkg",
                            "__init__.py")
            for r in range(4)
        }  # fmt: skip
        assert cluster.pull("f") == expect

        (pkg / "__init__.py").write_text("def where():\n    return __file__\n\nVERSION = 2\n")
        again = sync(cluster, [pkg], cwd=tmp_path / "nb")
        assert again.sent == ["hostpkg/__init__.py"] and again.bytes == 2 * size
        assert again.reloaded == {"hostpkg": [0, 1, 2, 3]}
        cluster.run("v = hostpkg.VERSION")
        assert cluster.pull("v") == {r: 2 for r in range(4)}
    finally:
        cluster.stop()
    assert not wait_no_cluster_processes(20)
