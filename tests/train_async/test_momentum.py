"""Async SGD with SGD(momentum=0.9) on 4 real ranks (3 workers): the mode lowers the
explicit momentum by the momentum asynchrony adds (1 - 1/3) and learns; with the
compensation off the optimizer's momentum applies as given (see workers/momentum.py).

What the uncompensated run learns is not asserted: it depends on how the workers were
scheduled. Eleven runs here (nine beside two busy loops) ended at final test losses
from 0.65 to 2.31 (chance: 2.30) with compensation off, and at 0.86-0.91 every time
with it on; one CI run's epoch means 1.99, 1.75, 1.71 failed an assertion that it
"stays at chance". When the workers take turns, little staleness arises and 0.9 works.
"""

import math

import pytest

from tests.train_async._results import results, run_worker

CHANCE = math.log(10)  # 2.30: the loss of a uniform guess over 10 digits


@pytest.fixture(scope="module")
def job():
    return results(run_worker(4, "momentum"))


def _workers(recs):
    assert sorted(recs) == [0, 1, 2, 3]
    return [rec for rec in recs.values() if not rec["serves"]]


def test_async_with_momentum_learns(job):
    recs = job["compensated"]
    for rec in recs.values():  # every rank built the same plan: 0.9 - (1 - 1/3)
        assert rec["plan"] == pytest.approx([0.9, 2 / 3, 0.9 - 2 / 3]), rec
    workers = _workers(recs)
    assert len(workers) == 3
    # What learned is the servers' final model: every worker loads it at the end, and it
    # has taken every worker's every push, however the workers were scheduled. A
    # worker's own last-epoch loss is no such witness: each step it trains on the
    # parameters it just fetched, so its last epoch measures the model at the moment
    # that worker ran it. On a loaded machine one worker can run ahead of the others
    # and do its last epoch on a model that has had far fewer updates (one CI run:
    # 2.25, 2.02, 1.60 for one worker; a loaded run here: last epochs 1.64, 1.08 and
    # 0.98, and the final model's loss 0.87, as in every run, loaded or not).
    for rec in workers:
        assert rec["test_loss"] < CHANCE - 0.7, rec["test_loss"]
        assert rec["test_loss"] == pytest.approx(workers[0]["test_loss"])  # the same model
        assert rec["losses"][-1] < rec["losses"][0], rec["losses"]  # each saw it learn


def test_the_first_worker_warns_once_with_the_numbers(job):
    recs = job["compensated"]
    for rec in recs.values():
        expected = 1 if rec["worker_index"] == 0 else 0
        assert len(rec["warnings"]) == expected, rec
    (message,) = next(r["warnings"] for r in recs.values() if r["worker_index"] == 0)
    for text in ("0.67", "0.23", "0.90", "3 workers", "compensate_momentum': False"):
        assert text in message, message


def test_without_compensation_the_optimizers_momentum_applies_as_given(job):
    recs = job["uncompensated"]
    for rec in recs.values():
        assert rec["plan"] is None and rec["warnings"] == []
    for rec in _workers(recs):  # it ran to the end and reported real losses
        assert len(rec["losses"]) == 3 and all(math.isfinite(x) for x in rec["losses"])
    # the servers measured gradients stale by about the workers' count or more
    (server,) = [rec for rec in recs.values() if rec["serves"]]
    assert server["mean_delay"] >= 1.0
