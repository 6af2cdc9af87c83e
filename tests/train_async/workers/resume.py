"""Parameter-server checkpoint and resume, in two separate jobs (3 ranks).

``first DIR``: train with checkpoints every 20 steps; at step 42 each worker
reads what the server has saved so far; at step 50 both workers crash (an
exception), so the run ends early and the server writes its final state.
``second DIR``: fresh processes and a different initial model load the
checkpoint, then train on to 4 epochs.
"""

import hashlib
import sys
from pathlib import Path

import torch
from _common import BATCH, TEST, TRAIN, mlp, report, sgd
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import Trainer

PHASE, DIR = sys.argv[1], Path(sys.argv[2])
SERVER_FILE = DIR / "checkpoint.server0.pt"


class Crash(Exception):
    pass


def server_state_hash(mode) -> str:
    """The shard and the update rule's momentum buffers: what must survive a restart."""
    h = hashlib.sha256(mode.handler.param.detach().numpy().tobytes())
    for state in mode.handler.rule.state.values():
        h.update(state["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()


def peek(trainer):
    if trainer.global_step == 42:
        saved = torch.load(SERVER_FILE, weights_only=True)["state"]
        report(scenario="peek", saved_progress=saved["progress"][comm.rank()])
    if trainer.global_step == 50:
        raise Crash()


def make(seed, hooks=None):
    model = mlp(seed)
    trainer = Trainer(
        model, sgd(model), F.cross_entropy, TRAIN, mode="ps", batch_size=BATCH,
        checkpoint_dir=DIR, checkpoint_every=20, hooks=hooks or {},
    )  # fmt: skip
    return trainer


if PHASE == "first":
    trainer = make(seed=5, hooks={"on_batch_end": peek})
    crashed = False
    try:
        trainer.fit(4)
    except Crash:
        crashed = True
    serves = trainer.mode.serves
    report(
        scenario="first",
        serves=serves,
        crashed=crashed,
        steps=trainer.global_step,
        losses=[h["loss"] for h in trainer.history],
        version=trainer.mode.handler.version if serves else None,
        state=server_state_hash(trainer.mode) if serves else None,
    )
else:
    trainer = make(seed=99)
    loaded = trainer.load_checkpoint()
    serves = trainer.mode.serves
    at = {
        "loaded": loaded,
        "progress": [trainer.epoch, trainer.step_in_epoch, trainer.global_step],
        "version": trainer.mode.handler.version if serves else None,
        "state": server_state_hash(trainer.mode) if serves else None,
    }
    history = trainer.fit(4)
    report(
        scenario="second",
        serves=serves,
        at_load=at,
        steps=trainer.global_step,
        losses=[h["loss"] for h in history],
        updates=trainer.mode.stats.get("updates") if serves else None,
        eval=trainer.evaluate(TEST),
    )
