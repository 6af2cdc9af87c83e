"""Every asynchronous mode (and allreduce, the reference) trains the digits MLP
on 3 and 4 real MPI ranks; parameter-server staleness stays within its bound.

One job per rank count runs every scenario of ``workers/modes.py``.
"""

import pytest

from tests.train_async._results import results, run_worker

MODES = ["ps", "async", "easgd", "easgd_sync", "gossip", "allreduce"]
VARIANTS = ["ps_s0", "ps_s1", "ps_2servers", "ps_fp16", "ps_topk", "ps_downpour", "ps_adam"]
STEPS = 8 * 30  # 8 epochs of 1440 digits, global batch 48
# The untrained model sits at ln(10) = 2.3; measured final test losses were
# 0.12-0.41 on 3 and 4 ranks (accuracy 0.92-0.96), and once 0.61 (accuracy 0.90) for
# gossip on 3 ranks in a CI run on a loaded machine (its peers' exchanges depend on
# timing), so the bound is 0.8: still a model that learned, far from chance.
MAX_LOSS, MIN_ACCURACY = 0.8, 0.85


@pytest.fixture(scope="module", params=[3, 4])
def job(request):
    return request.param, results(run_worker(request.param, "modes"))


def _check_learned(n, recs, name):
    assert sorted(recs) == list(range(n)), f"{name}: ranks reporting {sorted(recs)}"
    ev = recs[0]["eval"]
    for rank, rec in recs.items():
        assert rec["eval"] == ev, f"{name}: evaluation differs on rank {rank}"
    assert ev["samples"] == 357
    assert ev["loss"] < MAX_LOSS and ev["accuracy"] > MIN_ACCURACY, (name, ev)
    trainers = [rec for rec in recs.values() if not rec["serves"]]
    for rec in trainers:
        assert rec["steps"] == STEPS, (name, rec["rank"], rec["steps"])
        # each rank's own training loss went down, epoch over epoch overall
        assert rec["losses"][-1] < 0.5 * rec["losses"][0], (name, rec["rank"], rec["losses"])
    # after fit every trainer holds the same model (final parameters / center / average)
    assert len({rec["hash"] for rec in trainers}) == 1, name


@pytest.mark.parametrize("name", MODES)
def test_mode_learns_digits(job, name):
    n, res = job
    _check_learned(n, res[name], name)


@pytest.mark.parametrize("name", VARIANTS)
def test_parameter_server_variant_learns(job, name):
    n, res = job
    if name not in res:
        pytest.skip(f"{name} runs on 4 ranks only")
    _check_learned(n, res[name], name)


def _servers(recs):
    return [rec for rec in recs.values() if rec["serves"]]


@pytest.mark.parametrize("name", ["ps", "async", "ps_s0", "ps_s1", "ps_2servers"])
def test_server_applies_every_push_and_records_its_staleness(job, name):
    n, res = job
    if name not in res:
        pytest.skip(f"{name} runs on 4 ranks only")
    servers = _servers(res[name])
    workers = n - len(servers)
    assert len(servers) == (2 if name == "ps_2servers" else 1)
    for rec in servers:
        assert rec["stats"]["updates"] == workers * STEPS
        assert rec["staleness_count"] == workers * STEPS  # one record per applied gradient
        assert rec["stats"]["failed_workers"] == []
        assert "staleness" in rec["scalar_keys"] and "delay" in rec["scalar_keys"]


@pytest.mark.parametrize("name, bound", [("ps_s0", 0), ("ps_s1", 1), ("ps_2servers", 2)])
def test_bounded_staleness_never_exceeds_s(job, name, bound):
    n, res = job
    if name not in res:
        pytest.skip(f"{name} runs on 4 ranks only")
    for rec in _servers(res[name]):
        assert rec["staleness_max"] <= bound, rec
        assert rec["stats"]["max_staleness"] <= bound


def test_async_reads_are_stale(job):
    """Inconsistent reads never wait, so some gradients do come from old parameters."""
    n, res = job
    (server,) = _servers(res["async"])
    assert server["staleness_positive"] > 0 and server["stats"]["max_delay"] > 0


def test_workers_record_push_and_pull_timings(job):
    n, res = job
    for name, ops in [
        ("ps", {"ps_push", "ps_pull"}),
        ("easgd", {"easgd_exchange", "easgd_center"}),
        ("gossip", {"gossip_send", "gossip_recv"}),
    ]:
        for rec in res[name].values():
            if not rec["serves"]:
                assert ops <= set(rec["comm_ops"]), (name, rec["comm_ops"])
                assert {"loss", "comm_s"} <= set(rec["scalar_keys"]), (name, rec["scalar_keys"])
    ps = [rec for rec in res["ps"].values() if not rec["serves"]]
    assert all(rec["comm_ops"]["ps_push"] == STEPS for rec in ps)
    downpour = res.get("ps_downpour")
    if downpour:  # push every 2 steps, fetch every 3
        (server,) = _servers(downpour)
        assert server["stats"]["updates"] == (n - 1) * STEPS // 2
        for rec in downpour.values():
            if not rec["serves"]:
                assert rec["comm_ops"]["ps_push"] == STEPS // 2
                assert rec["comm_ops"]["ps_pull"] == STEPS // 3 + 2  # + first read, final
