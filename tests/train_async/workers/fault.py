"""A worker is killed (SIGKILL) in the middle of a parameter-server run.

Rank 0 serves, ranks 1-3 train with a staleness bound of 1 (so a dead worker
that still counted would block the others). Rank 2 kills itself at step 40.
Needs Open MPI's fault tolerance (the test runs it with ``fault_tolerant=True``).
After fit no rank touches the dead one: every report is local.
"""

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

from _common import BATCH, TRAIN, local_eval, mark, mlp, new_records, params_hash, report, sgd
from torch.nn import functional as F

from clusterkernel import comm
from clusterkernel.train import Trainer

VICTIM, KILL_AT, EPOCHS = 2, 40, 6
# If the job ever hangs (the test's timeout is 120 s), every rank shows where it was.
faulthandler.dump_traceback_later(60)


def die(trainer):
    if comm.rank() == VICTIM and trainer.global_step == KILL_AT:
        report(scenario="victim", step=trainer.global_step, killed_at=time.time())
        os.kill(os.getpid(), signal.SIGKILL)


scalars = mark("scalar")
model = mlp(seed=3)
trainer = Trainer(
    model, sgd(model), F.cross_entropy, TRAIN, mode="ps", mode_options={"staleness": 1},
    batch_size=BATCH, hooks={"on_batch_end": die}, checkpoint_dir=Path(sys.argv[1]),
)  # fmt: skip
trainer.fit(EPOCHS)
logged = [r["values"] for r in new_records("scalar", scalars) if "worker_failed" in r["values"]]
report(
    scenario="survivor",
    serves=trainer.mode.serves,
    steps=trainer.global_step,
    stats=trainer.mode.stats or None,
    failures_logged=[v["worker_failed"] for v in logged],
    noticed_at=[v["at_time"] for v in logged],
    local_eval=local_eval(model),
    hash=params_hash(model),
)
faulthandler.cancel_dump_traceback_later()
