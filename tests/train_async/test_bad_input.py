"""Bad options give a clear error on every rank; a failure inside one worker's
training reaches that worker only, and the others (and the server) finish."""

import pytest

from tests.train_async._results import results, run_worker

EXPECTED = {
    "no_worker": "leaves no worker; use servers <= 2",
    "stale_inconsistent": "cannot be combined",
    "stale_schedule": "needs fetch_every == push_every",
    "compression": "compression must be one of",
    "topk_ratio": "topk_ratio must be in (0, 1]",
    "update": "update must be None",
    "gossip_rate": "rate must be in (0, 1]",
    "easgd_alpha": "alpha must be in (0, 1)",
    "batch": "global_batch=1 is smaller than the 2 ranks",
    "resume_other_servers": "this run has 2 servers",
    "other_models": "different models (trainable parameters: rank 0: 2410 float32, rank 1: 2080",
}


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return results(run_worker(3, "bad_input", str(tmp_path_factory.mktemp("bad"))))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_error_on_every_rank(res, name):
    recs = res[name]
    assert sorted(recs) == [0, 1, 2]
    for rec in recs.values():
        assert rec["error"] and EXPECTED[name] in rec["error"], rec


def test_a_failing_worker_raises_there_and_the_rest_finish(res):
    recs = res["worker_raises"]
    assert recs[1]["error"] == "Boom: a bug in rank 1's hook"
    assert recs[0]["error"] is None and recs[2]["error"] is None


def test_a_failing_server_stops_every_worker(res):
    recs = res["server_raises"]
    assert recs[0]["error"] == "RuntimeError: a bug in the server's update"
    for w in (1, 2):
        assert "server rank(s) [0] stopped with an error" in recs[w]["error"], recs[w]


def test_a_failing_gossip_rank_is_reported_to_the_others(res):
    recs = res["gossip_raises"]
    assert recs[1]["error"] == "Boom: a bug in rank 1's hook"
    for r in (0, 2):
        assert "gossip: rank(s) [1] failed during training" in recs[r]["error"], recs[r]
