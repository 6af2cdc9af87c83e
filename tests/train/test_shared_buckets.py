"""DataParallel's gradient buckets in shared memory, on 2 and 4 real MPI ranks and 1
(see workers/shared_buckets.py)."""

import pytest

from tests._results import by_scenario


@pytest.fixture(scope="module", params=[2, 4, 1])
def sb(request, run_ranks):
    n = request.param
    runs = run_ranks(n, "shared_buckets", timeout=240)
    return n, by_scenario(rec for recs in runs.values() for rec in recs)


def _adapted(alg: str) -> bool:
    """An ordinary bucket of 512 KB or more: auto adapts from the table's choice (its
    records say why: "ring (probe)", "shm (switch)"); never the zero-copy "shm"."""
    return alg.endswith((" (probe)", " (switch)"))


def _recs(res, scenario, n):
    recs = res[scenario]
    assert sorted(recs) == list(range(n))
    return list(recs.values())


@pytest.mark.parametrize(
    "scenario",
    [
        "wide_input shared=None set_to_none=True",
        "narrow_input shared=None set_to_none=True",
        "wide_input shared=None set_to_none=False",
        "wide_input shared=False set_to_none=True",
        "small shared=None set_to_none=True",
        "small shared=True set_to_none=True",
    ],
)
def test_training_matches_one_process(sb, scenario):
    n, res = sb
    for rec in _recs(res, scenario, n):
        assert rec["steps"] == 6
        assert all(rec["identical"]), f"replicas differ after some step: {rec}"
        assert rec["max_diff"] < 1e-5, rec


@pytest.mark.parametrize("model", ["wide_input", "narrow_input"])
def test_default_buckets_are_shared_and_big_ones_reduce_in_place(sb, model):
    n, res = sb
    for rec in _recs(res, f"{model} shared=None set_to_none=True", n):
        assert rec["shared"] is (n > 1), rec
        if n == 1:
            continue
        assert rec["peers_ok"] == [True] * rec["steps"], "another rank's bucket, read here"
        big = [s for s in rec["bucket_bytes"] if s >= rec["big"]]
        assert len(big) >= 2, rec  # several outstanding zero-copy calls per step
        for size, alg in rec["algorithms"]:
            want = "shm" if size >= rec["big"] else rec["table_pick"][str(size)]
            assert alg == want or (size < rec["big"] and _adapted(alg)), rec
        assert {s for s, _ in rec["algorithms"]} == set(rec["bucket_bytes"]), rec


def test_narrow_input_mixes_a_blocking_mpi_bucket_with_outstanding_shm(sb):
    n, res = sb
    if n == 1:
        pytest.skip("no communication on one rank")
    for rec in _recs(res, "narrow_input shared=None set_to_none=True", n):
        assert min(rec["bucket_bytes"]) < rec["big"], rec  # the last bucket: small
        assert ("shm" in {a for _, a in rec["algorithms"]}) and len(rec["algorithms"]) >= 2


def test_opt_out_keeps_ordinary_memory(sb):
    n, res = sb
    for rec in _recs(res, "wide_input shared=False set_to_none=True", n):
        assert rec["shared"] is False and rec["peers_ok"] == [], rec
        for size, alg in rec["algorithms"]:
            assert alg == rec["table_pick"][str(size)] or _adapted(alg), rec


def test_shared_only_where_it_helps_unless_asked(sb):
    n, res = sb
    for rec in _recs(res, "small shared=None set_to_none=True", n):
        assert rec["shared"] is False, "no bucket reaches the zero-copy size"
    for rec in _recs(res, "small shared=True set_to_none=True", n):
        assert rec["shared"] is (n > 1), rec
        assert rec["peers_ok"] == ([True] * rec["steps"] if n > 1 else []), rec
        for size, alg in rec["algorithms"]:  # small buckets: the table's pick
            assert alg == rec["table_pick"][str(size)], rec
    if n > 1:
        for rec in _recs(res, "forced", n):
            assert rec["shared"] is False, "auto forced to MPI: nothing reduces in place"


def test_one_rank_that_cannot_share_makes_all_fall_back(sb):
    n, res = sb
    if n == 1:
        pytest.skip("one rank shares nothing")
    for rec in _recs(res, "fallback", n):
        assert rec["none_gave"], rec
        assert f"rank {n - 1}: a parameter is on meta" in rec["error"], rec
        assert "shared_buckets=True" in rec["error"], rec


def test_ranks_with_different_buckets_all_get_a_clear_error(sb):
    n, res = sb
    if n == 1:
        pytest.skip("one rank agrees with itself")
    for rec in _recs(res, "mismatch", n):
        assert "same bucket_bytes on every rank" in rec["error"], rec


def test_ranks_with_different_shared_buckets_all_get_a_clear_error(sb):
    n, res = sb
    if n == 1:
        pytest.skip("one rank agrees with itself")
    for rec in _recs(res, "choice mismatch", n):
        assert (
            "shared_buckets differs between ranks (rank 0: False, rank 1: None" in rec["error"]
        ), rec


def test_a_new_wrap_reuses_the_shared_memory_of_a_model_that_is_gone(sb):
    n, res = sb
    if n == 1:
        pytest.skip("one rank shares nothing")
    for rec in _recs(res, "reuse", n):
        assert rec["shared"] == [True, True], rec
        assert rec["second_new"] and rec["third_reused"], rec
        assert rec["new_windows"] == 0, rec  # the third made no window of its own
