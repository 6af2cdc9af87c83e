"""torch.distributed code, unchanged, on a real cluster's ranks (gloo on CPU).

``Cluster(torch=True)`` makes the default group (torchrun's environment on every start
and restart: tests/torchdist/test_torchrun_env.py); DDP, FSDP2 and a device mesh train
as they do under torchrun, checked against single-process training; a rank blocked in a
gloo collective is named from torch's own flight recorder and freed without losing the
ranks' variables.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from clusterkernel import Cluster
from clusterkernel.client.cluster._stacks import request_state
from clusterkernel.client.errors import CellInterrupted, RankError
from tests._procs import wait_no_cluster_processes
from tests._tiny_model import TINY


@pytest.fixture(scope="module")
def tcluster(_shared_holder):
    """A 2-rank cluster with torch.distributed's default group (the shared one stopped)."""
    if _shared_holder.cluster is not None:
        _shared_holder.cluster.stop()
        _shared_holder.cluster = None
    c = Cluster(n=2, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
    yield c
    c.stop()
    assert not wait_no_cluster_processes(20)


def test_the_group_is_made_at_start(tcluster: Cluster):
    groups = tcluster.torch_group()
    assert {g["backend"] for g in groups.values()} == {"gloo"}
    assert [g["rank"] for g in groups.values()] == [0, 1]
    assert {g["world_size"] for g in groups.values()} == {2}
    # each engine imported torch.distributed while it registered (rank/_warm_start.py),
    # a thread of its own; the variable was read and removed by then
    tcluster.run(
        "import os, psutil\n"
        "warm = '-mclusterkernel.rank._warm_start' in ''.join(psutil.Process().cmdline())\n"
        "asked = os.environ.get('CLUSTERKERNEL_PREIMPORT')"
    )
    assert set(tcluster.pull("warm").values()) == {True}
    assert set(tcluster.pull("asked").values()) == {None}


_DDP = """
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ref = copy.deepcopy(net)                      # trained alone on the whole batch
ddp = DDP(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
rank, size = dist.get_rank(), dist.get_world_size()
for step in range(5):
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    mine = slice(rank * 16 // size, (rank + 1) * 16 // size)
    opt.zero_grad(); torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward(); opt.step()
    ref_opt.zero_grad(); torch.nn.functional.mse_loss(ref(x), y).backward(); ref_opt.step()
ddp_diff = max((a - b).abs().max().item() for a, b in zip(net.parameters(), ref.parameters()))
"""


def test_ddp_equals_single_process_training_on_the_whole_batch(tcluster: Cluster):
    tcluster.run(_DDP)
    assert max(tcluster.pull("ddp_diff").values()) < 1e-6


_FSDP = (
    """
import copy, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
"""
    + TINY
    + """model = Tiny()
ref = copy.deepcopy(model)
for b in model.blocks:
    fully_shard(b)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(2)
losses, ref_losses = [], []
for step in range(4):
    tok = torch.randint(0, 32, (4, 6), generator=g)   # the same batch on every rank
    for m, o, out in ((model, opt, losses), (ref, ref_opt, ref_losses)):
        o.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())
        loss.backward(); o.step(); out.append(loss.item())
sharded = type(next(model.parameters())).__name__
fsdp_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
"""
)


def test_fsdp2_fully_shard_equals_the_unsharded_model(tcluster: Cluster):
    tcluster.run(_FSDP)
    assert set(tcluster.pull("sharded").values()) == {"DTensor"}
    assert max(tcluster.pull("fsdp_diff").values()) < 1e-4


_MESH = """
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
x = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
plain = mlp(x).detach().clone()
tp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
tp_diff = (tp(x) - plain).abs().max().item()
mesh_shape = tuple(mesh.shape)
"""


def test_tensor_parallel_on_a_device_mesh(tcluster: Cluster):
    tcluster.run(_MESH)
    assert set(tcluster.pull("mesh_shape").values()) == {(2,)}
    assert max(tcluster.pull("tp_diff").values()) < 1e-6


def test_a_second_init_is_a_clear_error_not_a_hang(tcluster: Cluster):
    with pytest.raises(RankError) as info:
        tcluster.run("import torch.distributed as dist\ndist.init_process_group()")
    assert info.value.ranks == [0, 1]
    assert "%mpi start --torch made it" in info.value.note


def _listening(port: int) -> bool:
    return any(
        c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )


def test_a_rank_blocked_in_gloo_is_named_and_freed_keeping_variables(tcluster: Cluster):
    tcluster.restart()  # nothing of the tests above holds the group (see the next test)
    tcluster.run(
        "import os, torch, torch.distributed as dist\nt = torch.ones(1000)\ndist.all_reduce(t)\n"
        "g = dist.new_group([0, 1])"  # a subgroup: closed by the abort, made again with the group
    )
    tcluster.run("port = int(os.environ['MASTER_PORT'])")
    old_port = tcluster.pull("port")[0]
    code = "kept = 41\nif dist.get_rank() == 0:\n    dist.all_reduce(t)\n"
    with pytest.raises(CellInterrupted) as info:
        tcluster.run(code, timeout=4)
    text = "\n".join(info.value.render(color=False))
    # torch's own flight recorder, compared across the ranks
    assert (
        "rank 0 waits in all_reduce #" in text and "(gloo, 3.91 KiB float32, cell line 3)" in text
    )
    assert "rank 1's last collective in gloo was #" in text and "finished the cell" in text
    assert "aborting its torch.distributed group freed it" in text
    assert "restarted" not in text
    # the variables stayed, a new group was made (the aborted group's store lives on in
    # rank 0's last traceback, for post-mortem: its port is not checked here)
    tcluster.run(
        "t = torch.ones(2)\ndist.all_reduce(t)\ntotal = t.tolist()\n"
        "u = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(u, group=g)\non_g = u.item()"
    )
    assert tcluster.pull("kept") == {0: 41, 1: 41}
    assert tcluster.pull("total") == {0: [2.0, 2.0], 1: [2.0, 2.0]}
    assert tcluster.pull("on_g") == {0: 3.0, 1: 3.0}
    assert (
        "A new default group is made (as %mpi torch-reinit does); torch.distributed "
        "subgroup(s) g made again." in text
    ), text
    tcluster.run("port = int(os.environ['MASTER_PORT'])")
    assert tcluster.pull("port")[0] != old_port
    # a second hang, in the group made again, is read as well as the first
    with pytest.raises(CellInterrupted) as again:
        tcluster.run("if dist.get_rank() == 1:\n    dist.all_reduce(t)\n", timeout=4)
    text = "\n".join(again.value.render(color=False))
    assert "rank 1 waits in all_reduce #2 (gloo, 8 B float32, cell line 2)" in text, text
    assert "aborting its torch.distributed group freed it" in text


def test_a_hang_with_ddp_and_fsdp_models_alive_is_freed_keeping_the_models(tcluster: Cluster):
    tcluster.run(_DDP + "ddp_opt = opt\n")  # ``ddp`` holds the default group
    tcluster.run(_FSDP)  # ``model`` holds its mesh's group
    tcluster.run(
        "import os, threading, torch\n"
        "lock = threading.Lock()\n"  # cannot be pickled, must stay all the same
        "before = [p.detach().clone() for p in ddp.parameters()]\n"
        "shards = [p.to_local().clone() for p in model.parameters()]\n"
        "pid = os.getpid()"
    )
    pids = tcluster.pull("pid")
    with pytest.raises(CellInterrupted) as info:
        tcluster.run(
            "kept = 1\nt = torch.ones(3)\nif dist.get_rank() == 1:\n    dist.all_reduce(t)\n",
            timeout=4,
        )
    text = "\n".join(info.value.render(color=False))
    assert "rank 1 waits in all_reduce #" in text
    assert "[rank 1]" in text and "aborting its torch.distributed group freed it" in text, text
    assert "restarted" not in text, text
    assert "DDP models hold the closed group: run ddp = torchdist.rewrap(ddp)" in text, text
    assert "FSDP models hold the closed group: b, model;" in text, text  # ``b``: a loop's last
    # the same processes, every variable kept, the models' tensors untouched
    assert tcluster.pull("pid") == pids
    tcluster.run(
        "ok = (kept, type(lock).__name__,\n"
        "      all(torch.equal(a, b) for a, b in zip(before, ddp.parameters())),\n"
        "      all(torch.equal(a, p.to_local()) for a, p in zip(shards, model.parameters())))"
    )
    assert set(tcluster.pull("ok").values()) == {(1, "lock", True, True)}
    # the one-liner: DDP again on the new group, the optimizer made before still works
    tcluster.run(
        "from clusterkernel import torchdist\n"
        "ddp = torchdist.rewrap(ddp)\n"
        "x = torch.randn(8, 8, generator=torch.Generator().manual_seed(dist.get_rank()))\n"
        "ddp_opt.zero_grad(); ddp(x).square().mean().backward(); ddp_opt.step()\n"
        "after = torch.cat([p.detach().flatten() for p in ddp.parameters()])\n"
        "moved = not torch.equal(after, torch.cat([b.flatten() for b in before]))"
    )
    after = tcluster.pull("after")
    assert torch_equal(after[0], after[1])  # gradients averaged over the new group
    assert set(tcluster.pull("moved").values()) == {True}
    with pytest.raises(RankError, match="FSDP2"):
        tcluster.run("torchdist.rewrap(model)")


_KEPT = """
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from clusterkernel import torchdist
def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    fully_shard(m[0])
    fully_shard(m)
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)
keep = torchdist.Keeper(build)
fsdp, fsdp_opt = keep.model, keep.optimizer
def train(step):
    g = torch.Generator().manual_seed(100 * step + dist.get_rank())
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
    fsdp_opt.zero_grad()
    torch.nn.functional.mse_loss(fsdp(x), y).backward()
    fsdp_opt.step()
def full():
    return torch.cat([p.full_tensor().flatten() for p in fsdp.parameters()])
for step in range(3):
    train(step)
keep.save(3)
saved = full()
train(3)
"""


def test_a_kept_fsdp2_model_is_rebuilt_on_the_new_group_after_a_hang(tcluster: Cluster):
    tcluster.run(_KEPT)
    with pytest.raises(CellInterrupted) as info:
        tcluster.run("if dist.get_rank() == 1:\n    dist.all_reduce(torch.ones(1))\n", timeout=4)
    text = "\n".join(info.value.render(color=False))
    assert "Run keep.restore() in a %%mpi cell" in text, text
    tcluster.run("back = keep.restore()\nrestored = full()\ntrain(3)\nafter = full()")
    assert tcluster.pull("back") == {0: 3, 1: 3}
    tcluster.run("held = repr(keep)")  # both holders keep their copy
    assert set(tcluster.pull("held").values()) == {"Keeper(step=3, copies=2, holds a copy)"}
    saved, restored, after = (tcluster.pull(n) for n in ("saved", "restored", "after"))
    for rank in (0, 1):
        assert torch_equal(saved[rank], restored[rank]), rank
    assert torch_equal(after[0], after[1]) and not torch_equal(after[0], saved[0])
    # training on did not change the kept copy: a second restore, a second step, the same
    tcluster.run("keep.restore()\nagain = full()\ntrain(3)\nafter_again = full()")
    for rank, weights in tcluster.pull("again").items():
        assert torch_equal(weights, saved[rank]), rank
    for rank, weights in tcluster.pull("after_again").items():
        assert torch_equal(weights, after[rank]), rank


def test_a_rank_wedged_in_c_code_holding_the_gil_is_named_and_restarted(tcluster: Cluster):
    # a pthread mutex locked twice through ctypes.PyDLL (which keeps the GIL): no signal,
    # no control request and no closed connection can free it
    code = (
        "import ctypes, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n"
        "    libc = ctypes.PyDLL(None)\n"
        "    m = ctypes.create_string_buffer(64)\n"
        "    libc.pthread_mutex_init(m, None)\n"
        "    libc.pthread_mutex_lock(m)\n"
        "    libc.pthread_mutex_lock(m)\n"
    )
    with pytest.raises(CellInterrupted) as info:
        tcluster.run(code, timeout=3)
    text = "\n".join(info.value.render(color=False))
    assert "[rank 1]" in text and "holds Python's GIL" in text, text
    assert "Rank 1 could not be interrupted, so all ranks were restarted" in text, text
    tcluster.run(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nv = t.item()"
    )
    assert tcluster.pull("v") == {0: 2.0, 1: 2.0}


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def _wait_in_torch_call(cluster: Cluster, run, rank: int, call: str) -> None:
    """Until ``rank`` alone is busy, inside torch.distributed's ``call`` (its stack)."""
    engines = {rank: cluster.engine_id(rank)}
    deadline = time.monotonic() + 120
    while True:
        frames = request_state(cluster.client, engines).get(rank, {}).get("frames", [])
        inside = any(f["name"] == call and "distributed" in f["file"] for f in frames)
        if inside and run.busy_ranks() == [rank]:
            return
        assert time.monotonic() < deadline, (run.busy_ranks(), frames)
        time.sleep(0.1)


def test_an_interrupt_inside_a_gloo_collective(tcluster: Cluster):
    tcluster.restart()  # nothing of the tests above holds the group, whichever ran
    tcluster.run("import torch, torch.distributed as dist\nt = torch.ones(10)\nkept = 'yes'")
    run = tcluster.run("if dist.get_rank() == 1:\n    dist.all_reduce(t)\n", block=False)
    # The interrupt once came before rank 1 was in the collective on a loaded machine
    # (a fixed 3 s timer); wait for the hang itself, as the kernel user would see it.
    _wait_in_torch_call(tcluster, run, rank=1, call="all_reduce")
    # While a cell runs, a kernel's SIGINT handler is Python's (ipykernel installs it):
    # the same here, whatever an earlier test's event loop left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(CellInterrupted) as info:
            run.wait()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    text = "\n".join(info.value.render(color=False))
    assert "[rank 1]" in text and "aborting its torch.distributed group freed it" in text
    assert tcluster.pull("kept") == {0: "yes", 1: "yes"}
    tcluster.run("t = torch.ones(1)\ndist.all_reduce(t)\none = t.item()")
    assert tcluster.pull("one") == {0: 2.0, 1: 2.0}


def test_reinit_and_restart_make_the_group_again(tcluster: Cluster):
    tcluster.run(
        "import os, torch, torch.distributed as dist\nport = int(os.environ['MASTER_PORT'])\n"
        "pair = dist.new_group([0, 1])"  # destroyed with the group, made again on the new one
    )
    before = tcluster.pull("port")[0]
    groups = tcluster.torch_reinit()
    assert {g["backend"] for g in groups.values()} == {"gloo"}
    assert {"pair" in g["subgroups"] for g in groups.values()} == {True}, groups
    tcluster.run(
        "u = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(u, group=pair)\none = u.item()"
    )
    assert tcluster.pull("one") == {0: 3.0, 1: 3.0}
    assert not _listening(before)
    tcluster.restart()
    assert {g["world_size"] for g in tcluster.torch_group().values()} == {2}
    tcluster.run(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\none = t.item()"
    )
    assert tcluster.pull("one") == {0: 2.0, 1: 2.0}


def test_ddp_bucket_timings_reach_the_dashboard(tcluster: Cluster):
    dash = tcluster.dashboard()
    try:
        tcluster.run(
            "import torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "from clusterkernel import metrics\n"
            "from clusterkernel.torchdist import timed_allreduce_hook\n"
            "metrics.recorder().clear()\n"
            "net = DDP(torch.nn.Linear(100, 10))\n"
            "net.register_comm_hook(None, timed_allreduce_hook)\n"
            "for _ in range(3):\n"
            "    net(torch.randn(4, 100)).sum().backward()\n"
            "recs = [r for r in metrics.recorder().records('comm') if r['op'] == 'torch all_reduce']\n"
            "timed = [(r['nbytes'], r['algorithm'], r['group_size'], r['duration'] > 0) for r in recs]"
        )
        for rank, timed in tcluster.pull("timed").items():
            assert timed == [((100 * 10 + 10) * 4, "gloo", 2, True)] * 3, (rank, timed)
        dash.sync()
        rows = [r for r in dash.store.comm_table() if r["op"] == "torch all_reduce"]
        assert [r["rank"] for r in rows] == [0, 1]
        for row in rows:
            assert row["count"] == 3 and row["nbytes"] == 3 * 4040 and row["seconds"] > 0
            assert row["algorithms"] == ["gloo"]
    finally:
        dash.close()


def test_plain_ddp_shows_every_all_reduce_without_a_hook_from_the_user(tcluster: Cluster):
    """A dashboard open and ``DDP(model)`` alone: each bucket's all-reduce is in the comm
    table (blocked time blank: not measured) and every call is drawn in the timeline."""
    from clusterkernel.client.dashboard._views import QUIET_AFTER, DashboardView

    dash = tcluster.dashboard()
    try:
        # what an earlier test's cell left in the ranks' stream arrives first, then goes
        tcluster.run("pass")
        dash.sync()
        dash.clear()
        tcluster.run(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "plain = DDP(torch.nn.Linear(100, 10))\n"
            "for _ in range(200):\n"
            "    plain(torch.randn(4, 100)).sum().backward()"
        )
        dash.sync()
        rows = [r for r in dash.store.comm_table() if r["op"] == "torch all_reduce"]
        got = [(r["rank"], r["count"], r["nbytes"], r["wait_s"]) for r in rows]
        assert got == [(rank, 200, 200 * 4040, None) for rank in (0, 1)]
        time.sleep(QUIET_AFTER + 0.2)  # the ranks went quiet: the last window stays
        view = DashboardView(window=10.0)
        view.comm.update(dash.store)
        assert "torch all_reduce" in view.comm.widget.value
        assert "0.0000</td></tr>" not in view.comm.widget.value.split("torch all_reduce")[1]
        view.timeline.update(dash.store, [0, 1])
        x, y = view.timeline.plot.drawn()["torch all_reduce"]
        bars, rows = x.reshape(-1, 2), y.reshape(-1, 2)[:, 0]
        now = dash.store.latest() + QUIET_AFTER
        for rank in (0, 1):
            lane = bars[abs(rows - (rank - 0.18)) < 1e-9]  # comm sits just above its rank
            calls = [r for r in dash.store.records("comm", ranks=[rank])
                     if r["op"] == "torch all_reduce"][-200:]  # fmt: skip
            off = dash.store.wall_offset(rank)
            mids = [r["start"] + r["duration"] / 2 + off - now for r in calls]
            missing = [m for m in mids if not any(a <= m <= b for a, b in lane)]
            assert not missing, f"rank {rank}: {len(missing)} of 200 calls not drawn"
    finally:
        dash.close()
