"""Each mode's own checkpoint layout, on 3 ranks: save after one epoch, load into a
fresh Trainer (other initial weights), compare what every rank got back.

``DIR`` holds one checkpoint file per mode. Rank 0 also reports the file's layout
(replicated: one state; gathered: one per rank, with the mode's own piece).
"""

import hashlib
import sys
from pathlib import Path

import torch
from _common import BATCH, TRAIN, mlp, params_hash, report, sgd
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import Trainer

DIR = Path(sys.argv[1])
MODES = {
    "allreduce": {},
    "local": {},
    "gossip": {"average_at_end": False, "rate": 0.5},  # replicas stay apart
    "easgd": {"synchronous": True},
}


def optimizer_hash(opt: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for state in opt.state.values():
        h.update(state["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()


def mode_state(mode) -> object:
    if mode.name == "gossip":
        return mode.weight
    if mode.name == "easgd":
        return hashlib.sha256(mode.center.numpy().tobytes()).hexdigest()
    return None


def trainer(name: str, seed: int) -> Trainer:
    model = mlp(seed)
    return Trainer(
        model, sgd(model), F.cross_entropy, TRAIN, mode=name, mode_options=MODES[name],
        batch_size=BATCH, prefetch=False,
    )  # fmt: skip


def layout(path: Path) -> dict:
    ckpt = torch.load(path, weights_only=True)
    return {
        "replicated": ckpt["meta"]["replicated"],
        "states": len(ckpt["ranks"]),
        "keys": sorted(ckpt["ranks"][0]),
        "mode_keys": [sorted(state["mode"]) for state in ckpt["ranks"]],
    }


for name in MODES:
    first = trainer(name, seed=5)
    first.fit(1)
    path = first.save_checkpoint(DIR / f"{name}.pt")
    saved = {
        "model": params_hash(first.model),
        "optimizer": optimizer_hash(first.optimizer),
        "mode": mode_state(first.mode),
    }
    first.close()
    second = trainer(name, seed=50 + comm.rank())
    fresh = params_hash(second.model)
    loaded = second.load_checkpoint(path)
    report(
        scenario=name,
        loaded=loaded,
        changed=params_hash(second.model) != fresh,
        saved=saved,
        restored={
            "model": params_hash(second.model),
            "optimizer": optimizer_hash(second.optimizer),
            "mode": mode_state(second.mode),
        },
        progress=[second.epoch, second.step_in_epoch, second.global_step],
        layout=layout(path) if comm.rank() == 0 else None,
    )
    second.close()
