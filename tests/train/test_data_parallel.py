"""DataParallel on 1-3 real MPI ranks (see workers/data_parallel.py)."""

from itertools import chain

import pytest

from tests._results import by_scenario


@pytest.fixture(scope="module", params=[2, 3, 1])
def dp(request, run_ranks):
    n = request.param
    return n, by_scenario(chain.from_iterable(run_ranks(n, "data_parallel", timeout=150).values()))


def test_matches_single_process_and_replicas_bit_identical(dp):
    n, res = dp
    for scenario in ("equivalence_set_to_none=True", "equivalence_set_to_none=False"):
        recs = res[scenario]
        assert sorted(recs) == list(range(n))
        for rec in recs.values():
            assert rec["steps"] == 6
            assert all(rec["identical"]), f"replicas differ after some step: {rec}"
            assert rec["max_diff"] < 1e-6, rec
            assert rec["buckets"] >= 2  # the small bucket size really split the model


def test_no_sync_accumulation_matches_full_batch(dp):
    n, res = dp
    for rec in res["no_sync"].values():
        assert rec["identical"] and rec["max_diff"] < 1e-6, rec


def test_unused_parameters_average_and_none(dp):
    n, res = dp
    for rec in res["unused"].values():
        assert rec["none_ok"], "a parameter no rank used must keep grad=None, others a grad"
        assert rec["max_diff"] < 1e-6 and rec["identical"], rec


@pytest.mark.parametrize("mode", ["average", "broadcast"])
def test_buffers_synchronized(dp, mode):
    n, res = dp
    for rec in res[f"buffers_{mode}"].values():
        assert rec["identical"] and rec["max_diff"] < 1e-6 and rec["tracked"] == 1, rec


def test_fp16_compression_close_and_identical(dp):
    n, res = dp
    for rec in res["fp16"].values():
        assert rec["identical"], rec
        assert rec["max_diff"] < 1e-3, rec


def test_misuse_gives_clear_errors(dp):
    n, res = dp
    for rec in res["misuse"].values():
        assert "never synchronized" in rec["errors"]["forgot"]
        assert "synchronize()" in rec["errors"]["forgot"]
        assert "no_sync" in rec["errors"]["twice"]
        assert rec["still_works"]
