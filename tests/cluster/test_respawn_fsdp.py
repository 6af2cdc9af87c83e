"""An FSDP2 model and a DDP model both train on after a rank died and was respawned.

Real ranks of a fault-tolerant (Open MPI ULFM) cluster with torch's default group
(gloo, CPU). The FSDP2 model (``fully_shard`` on a small attention model) lives in a
``torchdist.Keeper``: its full state kept on ranks 0 and 1 every 5 steps. Rank 0, one
of the two holders, is SIGKILLed mid-loop; ``%mpi respawn --from 1`` typed in a real
IPython shell brings it back, rebuilds the FSDP2 model on the new group from the
surviving holder's copy and wraps the DDP model again; the loops are run again as
they are and end at the undisturbed run's weights on every rank.
"""

from __future__ import annotations

import pytest

from clusterkernel import Cluster, RankError
from tests._procs import wait_dead, wait_no_cluster_processes
from tests._tiny_model import TINY
from tests.cluster.test_respawn import _stop_shared

_SETUP = (
    """
import os, signal, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from clusterkernel import torchdist

"""
    + TINY
    + """
def build():
    torch.manual_seed(0)
    model = Tiny()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)

keep = torchdist.Keeper(build)
model, opt = keep.model, keep.optimizer

def tokens(step):                 # each rank's own batch, drawn from the step alone
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randint(0, 32, (4, 7), generator=g)

torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ddp = DDP(net)
ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
ddp_step = 0
"""
)

_FSDP_LOOP = """
for step in range(keep.step, 24):
    if DIE and step == 17 and dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    tok = tokens(step)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())
    loss.backward()
    opt.step()
    if (step + 1) % 5 == 0:
        keep.save(step + 1)
weights = torch.cat([p.full_tensor().flatten() for p in model.parameters()])
"""

_DDP_LOOP = """
while ddp_step < STOP:
    g = torch.Generator().manual_seed(1000 * ddp_step + dist.get_rank())
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
    ddp_opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    ddp_opt.step()
    ddp_step += 1
ddp_weights = torch.cat([p.detach().flatten() for p in net.parameters()])
"""


@pytest.fixture(scope="module")
def ft(_shared_holder):
    """A 4-rank fault-tolerant cluster with torch's default group (the shared one stopped)."""
    _stop_shared(_shared_holder)
    c = Cluster(n=4, fault_tolerant=True, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
    yield c
    c.stop()
    assert not wait_no_cluster_processes(20)


def test_fsdp2_and_ddp_models_train_on_after_a_holder_is_respawned(ft: Cluster, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    import clusterkernel.client.magics as ck_magics

    ft.run(_SETUP + "DIE = False\n" + _FSDP_LOOP + "STOP = 10\n" + _DDP_LOOP, timeout=120)
    undisturbed = ft.pull("weights")[0], ft.pull("ddp_weights")[0]
    ft.run(_SETUP + "DIE = True\nSTOP = 5\n" + _DDP_LOOP, timeout=120)
    pid = ft.rank_info[0]["pid"]
    with pytest.raises(RankError) as info:
        ft.run(_FSDP_LOOP, timeout=120)
    assert [f.ranks for f in info.value.failures if f.kind == "died"] == [[0]]
    wait_dead(ft, [0])
    assert set(ft.pull("keep.step", ranks=[1, 2, 3]).values()) == {15}  # the last save
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = ft
    try:
        shell.run_line_magic("mpi", "respawn --from 1")
    finally:
        magics.cluster = None
    said = capsys.readouterr().out
    assert "Rank 0 respawned from rank 1" in said, said
    assert "rebuilt on the new group from their last save: keep (step 15)" in said, said
    assert "DDP model(s) ddp wrapped again on the new group" in said, said
    assert ft.rank_info[0]["pid"] != pid and not ft.dead
    # the FSDP2 model is new, on the new group, and the names hold it on every rank
    ft.run("same = (model is keep.model, opt is keep.optimizer, keep.step)\nheld = repr(keep)")
    assert set(ft.pull("same").values()) == {(True, True, 15)}
    # the new rank 0 is a holder again (from rank 1's copy): a later death recovers too
    assert ft.pull("held") == {
        r: f"Keeper(step=15, copies=2, holds {'a' if r < 2 else 'no'} copy)" for r in range(4)
    }
    # both loops run again as they are: from the last save, and from where DDP was
    ft.run("DIE = False\n" + _FSDP_LOOP + "STOP = 10\n" + _DDP_LOOP, timeout=120)
    for rank, weights in ft.pull("weights").items():
        assert (weights - undisturbed[0]).abs().max().item() < 1e-5, rank
    for rank, weights in ft.pull("ddp_weights").items():
        assert (weights - undisturbed[1]).abs().max().item() < 1e-5, rank


def test_a_keeper_with_every_copy_lost_and_bad_input_say_what_to_do(ft: Cluster):
    ft.run(
        "bad = []\n"
        "for arg in ('model', lambda: 3):\n"
        "    try:\n        torchdist.Keeper(arg)\n"
        "    except TypeError as e:\n        bad.append(str(e))\n"
        "lost = torchdist.Keeper(build, copies=1)\n"
        "lost._kept = None                 # as if rank 0, its one holder, had died\n"
        "try:\n    lost.restore()\nexcept RuntimeError as e:\n    said = str(e)\n"
    )
    bad = ft.pull("bad")[0]
    assert "build must be a function returning (model, optimizer)" in bad[0], bad
    assert "build() must return (model, optimizer), got int" in bad[1], bad
    assert set(ft.pull("said").values()) == {
        "Keeper: no rank holds a kept state (rank 0 kept it and died); rebuild the model "
        "and start again, or keep more copies (torchdist.Keeper(build, copies=2))."
    }
