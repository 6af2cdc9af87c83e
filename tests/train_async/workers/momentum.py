"""Async SGD with the usual SGD(lr=0.05, momentum=0.9) on the digits MLP, global
batch 60, with the mode's momentum compensation on (default) and off.

Every rank reports its role, the momentum plan, the warnings it got while the
Trainer was built, its epoch losses, and the final model's test loss; servers add
the measured mean delay.
"""

import os
import warnings

import torch
from _common import TRAIN, local_eval, mlp, report
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import Trainer

EPOCHS = int(os.environ.get("CK_EPOCHS", 3))
BATCH = 60  # 20 per worker on 3 workers


def run(name: str, options: dict) -> None:
    model = mlp(seed=1 + comm.rank())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(
            model, opt, F.cross_entropy, TRAIN, mode="async", mode_options=options,
            batch_size=BATCH,
        )  # fmt: skip
    history = trainer.fit(EPOCHS)
    plan = trainer.mode.momentum
    report(
        scenario=name,
        serves=trainer.mode.serves,
        worker_index=None if trainer.mode.serves else trainer.mode.index,
        plan=None if plan is None else [plan.requested, plan.implicit, plan.explicit],
        warnings=[str(w.message) for w in caught if "momentum" in str(w.message)],
        losses=[h["loss"] for h in history],
        test_loss=local_eval(model)["loss"],
        mean_delay=trainer.mode.stats.get("mean_delay"),
    )
    trainer.close()


run("compensated", {})
run("uncompensated", {"compensate_momentum": False})
