"""Every training mode on the digits MLP, on the ranks of one job (3 or 4).

For each scenario every rank reports its role, epoch losses, the evaluation
(collective), its model's hash, and what it recorded: staleness of applied
gradients on servers, comm operations and logged scalar names everywhere.
"""

import os
import sys
from collections import Counter

from _common import BATCH, TEST, TRAIN, mark, mlp, new_records, params_hash, report, sgd
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import Trainer

WORLD = comm.size()
EPOCHS = int(os.environ.get("CK_EPOCHS", 8))
SCENARIOS = [
    ("ps", "ps", {}),
    ("async", "async", {}),
    ("easgd", "easgd", {}),
    ("easgd_sync", "easgd", {"synchronous": True}),
    ("gossip", "gossip", {}),
    ("allreduce", "allreduce", {}),
    ("ps_s0", "ps", {"staleness": 0}),
    ("ps_s1", "ps", {"staleness": 1}),
]
if WORLD >= 4:
    SCENARIOS += [
        ("ps_2servers", "ps", {"servers": 2, "staleness": 2}),
        ("ps_fp16", "ps", {"compression": "fp16"}),
        ("ps_topk", "ps", {"compression": "topk", "topk_ratio": 0.1}),
        ("ps_downpour", "ps", {"push_every": 2, "fetch_every": 3}),
        ("ps_adam", "ps", {"update": "adam", "update_options": {"lr": 0.01}}),
    ]


def run(name: str, mode: str, options: dict) -> None:
    scalars, comms = mark("scalar"), mark("comm")
    model = mlp(seed=1 + comm.rank())  # ranks start apart: the mode must sync them
    trainer = Trainer(
        model, sgd(model), F.cross_entropy, TRAIN, mode=mode, mode_options=options,
        batch_size=BATCH,
    )  # fmt: skip
    history = trainer.fit(EPOCHS)
    ev = trainer.evaluate(TEST)
    logged = new_records("scalar", scalars)
    staleness = [r["values"]["staleness"] for r in logged if "staleness" in r["values"]]
    serves = trainer.mode.serves
    report(
        scenario=name,
        serves=serves,
        losses=[h["loss"] for h in history],
        steps=trainer.global_step,
        eval=ev,
        hash=params_hash(model),
        staleness_max=max(staleness, default=None),
        staleness_count=len(staleness),
        staleness_positive=sum(s > 0 for s in staleness),
        stats=getattr(trainer.mode, "stats", None) or None,
        comm_ops=dict(Counter(r["op"] for r in new_records("comm", comms))),
        scalar_keys=sorted({k for r in logged for k in r["values"]}),
    )
    trainer.close()


ONLY = sys.argv[1:]  # scenario names to run (all when empty), for measuring
for scenario in SCENARIOS:
    if not ONLY or scenario[0] in ONLY:
        run(*scenario)
