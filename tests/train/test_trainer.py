"""Trainer on 2 and 3 real MPI ranks (see workers/trainer.py)."""

import pytest


@pytest.fixture(scope="module", params=[2, 3])
def trainer_run(request, run_ranks, tmp_path_factory):
    n = request.param
    tmp = tmp_path_factory.mktemp(f"trainer{n}")
    results = run_ranks(n, "trainer", str(tmp), timeout=180)
    by = {}
    for rank, recs in results.items():
        for rec in recs:
            by.setdefault(rec["scenario"], {})[rank] = rec
    return n, by


def test_fit_evaluate_hooks_metrics(trainer_run):
    n, res = trainer_run
    recs = res["fit"]
    assert sorted(recs) == list(range(n))
    for rank, rec in recs.items():
        steps = rec["steps"]
        assert steps == 3 * 30  # 1440 training digits, global batch 48
        assert rec["calls"] == {
            "on_start": 1,
            "on_batch_end": steps,
            "on_epoch_end": 3,
            "on_end": 1,
        }
        losses = rec["epoch_losses"]
        assert losses[0] > losses[1] > losses[2], losses
        # every rank logged its own loss, throughput and comm time at every step
        assert rec["logged_steps"] == list(range(1, steps + 1))
        assert rec["logged_keys"] == ["comm_s", "loss", "samples_per_s"]
        assert rec["logged_rank"] == rank and rec["positive_throughput"]
        assert rec["spans"] == {"forward_backward": steps, "optimizer_step": steps}
        # evaluation counts every test sample once, across ranks, same answer everywhere
        assert rec["eval"]["samples"] == rec["test_size"] == 357
        assert rec["eval"] == recs[0]["eval"]
        assert rec["eval"]["accuracy"] > 0.85, rec["eval"]
        # synchronous data parallel = one process with the global batch
        assert rec["identical"] and rec["max_diff"] < 1e-5, rec


def test_resume_after_crash_continues_exactly(trainer_run):
    n, res = trainer_run
    for rec in res["resume"].values():
        assert rec["crashed"] and rec["loaded"]
        assert rec["resumed_at"] == [0, 6, 6]  # last checkpoint before the crash at step 7
        assert rec["final_step"] == 3 * rec["steps_per_epoch"]
        assert rec["equal"], "resumed run must end bit-identical to the uninterrupted one"


def test_mode_registered_from_outside(trainer_run):
    n, res = trainer_run
    for rec in res["custom_mode"].values():
        assert rec["steps"] == 30
        assert rec["identical"] and rec["max_diff"] < 1e-5, rec


def test_pipeline_mode_matches_one_process(trainer_run):
    n, res = trainer_run
    recs = res["pipeline"]
    assert sorted(recs) == list(range(n))
    for rec in recs.values():
        assert rec["max_diff"] < 1e-5, rec
        assert rec["losses"] == pytest.approx(rec["ref_losses"], abs=1e-5)
        assert rec["eval"]["samples"] == 357 and rec["eval"]["accuracy"] > 0.8
        assert rec["restored"]


def test_allreduce_on_a_subgroup(trainer_run):
    n, res = trainer_run
    if n < 3:
        pytest.skip("needs a rank outside the group")
    recs = res["group"]
    members = [r for r, rec in recs.items() if rec["member"]]
    assert members == [0, n - 1]
    for r in members:
        assert recs[r]["identical"] and recs[r]["max_diff"] < 1e-5, recs[r]
