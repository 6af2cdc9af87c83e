"""A global batch of 64 on 3 real MPI ranks (22/21/21): allreduce training equals one
process with the whole batch (see workers/uneven_batch.py)."""

from itertools import chain

import pytest

from clusterkernel.partition import batch_shares
from tests._results import by_scenario as _by_scenario


@pytest.fixture(scope="module")
def by_scenario(run_ranks):
    return _by_scenario(chain.from_iterable(run_ranks(3, "uneven_batch", timeout=180).values()))


def test_uneven_global_batch_equals_one_process(by_scenario):
    recs = by_scenario["allreduce"]
    assert sorted(recs) == [0, 1, 2]
    last = batch_shares(1440 % 64, 3)  # the epoch's short last batch, split the same way
    for rank, rec in recs.items():
        assert rec["batch_sizes"] == [batch_shares(64, 3)[rank]] * 22 + [last[rank]]
        assert rec["steps"] == 2 * 23
        assert rec["identical"], rank
        assert rec["max_diff"] < 1e-5, rec


def test_without_the_weighting_it_would_not(by_scenario):
    # the same run averaging the unequal batches' means plainly drifts away:
    # the equality above depends on the weights
    for rec in by_scenario["allreduce_unweighted"].values():
        assert rec["identical"]
        assert rec["max_diff"] > 100 * 1e-5, rec
