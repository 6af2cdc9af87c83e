"""An FSDP2 model and a DDP model both train on after a rank died and was respawned.

Real ranks of a fault-tolerant (Open MPI ULFM) cluster with torch's default group
(gloo, CPU). The FSDP2 model (``fully_shard`` on a small attention model) lives in a
``torchdist.Keeper``: its full state kept on ranks 0 and 1 every 5 steps. Rank 0, one
of the two holders, is SIGKILLed mid-loop; ``%mpi respawn --from 1`` typed in a real
IPython shell brings it back, rebuilds the FSDP2 model on the new group from the
surviving holder's copy and wraps the DDP model again; the loops are run again as
they are and end at the undisturbed run's weights on every rank. Inside a running
cell, with auto-respawn, a ``train.steps(n, keep=keep)`` loop does the same by itself:
a rank killed mid-loop is respawned, every rank rebuilds the model from the last save
and the cell ends at the same weights; without ``keep=`` the cell fails on every rank
with what to do.
"""

from __future__ import annotations

import pytest

from clusterkernel import Cluster, RankError
from tests._procs import wait_dead
from tests._tiny_model import TINY

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
def undisturbed(ft: Cluster) -> tuple:
    """The FSDP2 and DDP weights of both loops run with no death."""
    ft.run(_SETUP + "DIE = False\n" + _FSDP_LOOP + "STOP = 10\n" + _DDP_LOOP, timeout=120)
    return ft.pull("weights")[0], ft.pull("ddp_weights")[0]


def test_fsdp2_and_ddp_models_train_on_after_a_holder_is_respawned(
    ft: Cluster, undisturbed: tuple, capsys
):
    from IPython.core.interactiveshell import InteractiveShell

    import clusterkernel.client.magics as ck_magics

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


# the FSDP2 loop written with train.steps: saved inside the step, every 5 steps
_STEPS_LOOP = """
from clusterkernel import train
for s in train.steps(24, keep=keep):
    with s:
        if s.index == 17 and os.getpid() == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        tok = tokens(s.index)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())
        loss.backward()
        opt.step()
        if (s.index + 1) % 5 == 0:
            keep.save(s.index + 1)
weights = torch.cat([p.full_tensor().flatten() for p in model.parameters()])
where = (s.index, keep.step, model is keep.model, opt is keep.optimizer, dist.get_world_size())
"""


@pytest.mark.parametrize("victim", [2, 0], ids=["rank 2", "rank 0, a holder"])
def test_an_fsdp2_loop_under_train_steps_is_rebuilt_inside_its_cell(
    ft: Cluster, undisturbed: tuple, capsys, victim: int
):
    """``%mpi start --respawn``: an FSDP2 model in a Keeper (copies on ranks 0 and 1),
    trained by a ``train.steps(24, keep=keep)`` loop that saves every 5 steps; rank 2
    (no copy), or rank 0 (a holder), SIGKILLed at step 17. The survivors respawn it
    inside the cell, every rank rebuilds the model on the new group from the save of
    step 15 (the new rank as its loop starts), the names ``model`` and ``opt`` the loop
    reads are the new ones, steps 15-23 are redone, and the cell ends on four ranks at
    the undisturbed run's weights."""
    ft.run(_SETUP + f"VICTIM = os.getpid() if dist.get_rank() == {victim} else None\n")
    old = {r: ft.rank_info[r]["pid"] for r in range(4)}
    capsys.readouterr()
    ft.auto_respawn = True
    try:
        ft.run(_STEPS_LOOP, timeout=120)
    finally:
        ft.auto_respawn = False
    said = capsys.readouterr()
    text = said.out + said.err
    source = 1 if victim == 0 else 0
    assert (
        f"Rank {victim} died (killed by SIGKILL) during this cell and was respawned from "
        f"rank {source} in" in text
    ), text
    assert "the cell went on" in text, text
    # and rank 0 says from where: the save of step 15, not the step that failed
    assert "train.steps: rebuilt from keep's save at step 15; the steps from 15 on" in text
    assert {r for r in range(4) if ft.rank_info[r]["pid"] != old[r]} == {victim}
    assert ft.live_ranks == [0, 1, 2, 3] and not ft.dead
    assert ft.pull("where") == dict.fromkeys(range(4), (23, 20, True, True, 4))
    apart = {r: (w - undisturbed[0]).abs().max().item() for r, w in ft.pull("weights").items()}
    assert max(apart.values()) < 1e-5, apart


def test_an_fsdp2_model_in_a_steps_loop_without_keep_fails_its_cell_with_what_to_do(
    ft: Cluster,
):
    """The same loop written ``train.steps(24)``, no keeper passed: after rank 2 is
    respawned inside the cell every rank fails it at once, naming the FSDP2 model and
    what to do (not a step on the closed group, which hangs), and ``keep.restore()``
    then rebuilds the model from the save of step 15, as the error says."""
    ft.run(_SETUP + "VICTIM = os.getpid() if dist.get_rank() == 2 else None\n")
    ft.auto_respawn = True
    try:
        with pytest.raises(RankError) as info:
            loop = _STEPS_LOOP.replace("train.steps(24, keep=keep)", "train.steps(24)")
            ft.run(loop, timeout=120)
    finally:
        ft.auto_respawn = False
    said = str(info.value)
    assert "steps(): model is an FSDP2 (fully_shard) model and cannot go on" in said, said
    assert {r for f in info.value.failures for r in f.ranks if f.kind == "error"} == {0, 1, 2, 3}
    assert ft.live_ranks == [0, 1, 2, 3] and not ft.dead
    ft.run("back = (keep.restore(), model is keep.model)")
    assert ft.pull("back") == dict.fromkeys(range(4), (15, True))


def test_a_keeper_with_every_copy_lost_and_bad_input_say_what_to_do(ft: Cluster):
    ft.run(
        "bad = []\n"
        "for arg in ('model', lambda: 3):\n"
        "    try:\n        torchdist.Keeper(arg)\n"
        "    except TypeError as e:\n        bad.append(str(e))\n"
        "from clusterkernel import train\n"
        "for call in (lambda: train.steps(3, keep='keep'),\n"
        "             lambda: train.steps(3, model=model, optimizer=opt, keep=keep),\n"
        "             lambda: train.steps(3, model=model, optimizer=opt)):\n"
        "    try:\n        call()\n"
        "    except (TypeError, ValueError) as e:\n        bad.append(str(e))\n"
        "lost = torchdist.Keeper(build, copies=1)\n"
        "lost._kept = None                 # as if rank 0, its one holder, had died\n"
        "try:\n    lost.restore()\nexcept RuntimeError as e:\n    said = str(e)\n"
    )
    bad = ft.pull("bad")[0]
    assert "build must be a function returning (model, optimizer)" in bad[0], bad
    assert "build() must return (model, optimizer), got int" in bad[1], bad
    assert "keep must be a torchdist.Keeper (keep = torchdist.Keeper(build)), got str" in bad[2]
    assert "pass keep= alone" in bad[3] and "drop model= and optimizer=" in bad[3], bad
    assert "model is an FSDP2 (fully_shard) model" in bad[4], bad
    assert "steps(n, keep=keep) instead of model= and optimizer=" in bad[4], bad
    assert set(ft.pull("said").values()) == {
        "Keeper: no rank holds a kept state (rank 0 kept it and died); rebuild the model "
        "and start again, or keep more copies (torchdist.Keeper(build, copies=2))."
    }
