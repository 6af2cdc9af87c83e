"""PipelineParallel on 2 and 3 real MPI ranks (see workers/pipeline.py)."""

import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_pipeline_gradients_and_errors(run_ranks, n):
    results = run_ranks(n, "pipeline", timeout=120)
    grads = [r for recs in results.values() for r in recs if r["scenario"].startswith("grads")]
    assert len(grads) == 2 * n
    for rec in grads:
        assert len(rec["balance"]) == n and min(rec["balance"]) >= 1
        assert rec["grad_diff"] < 1e-6, rec
        assert rec["loss_diff"] < 1e-6, rec
        assert rec["fwd_diff"] < 1e-6, rec
        assert rec["none_elsewhere"], "forward() returns output on the last rank only"

    errs = [r for recs in results.values() for r in recs if r["scenario"] == "errors"]
    assert len(errs) == n  # every rank raised (none hung), and recovered
    for rec in errs:
        e = rec["errors"]
        assert "stage 0 (rank 0)" in e["bad_input"] and "mat1 and mat2" in e["bad_input"]
        assert f"stage {n - 1} (rank {n - 1})" in e["bad_target"]
        assert "4 targets for 6 samples" in e["bad_target"]
        assert "x=None" in e["no_input"]
        assert rec["recovered"]
