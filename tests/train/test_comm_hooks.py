"""DataParallel's comm hooks on 2 and 3 real MPI ranks (see workers/comm_hooks.py)."""

import pytest

from tests._results import by_scenario


@pytest.fixture(scope="module", params=[2, 3])
def hooks(request, run_ranks):
    n = request.param
    runs = run_ranks(n, "comm_hooks", timeout=150)
    return n, by_scenario(rec for recs in runs.values() for rec in recs)


def _all(res, scenario, n):
    recs = res[scenario]
    assert sorted(recs) == list(range(n))
    return recs.values()


def test_fp16_option_is_the_fp16_wrapper_around_allreduce(hooks):
    n, res = hooks
    for rec in _all(res, "fp16", n):
        assert rec["same_as_option"] and rec["identical"], rec
        assert rec["max_diff"] < 1e-3, rec
        assert rec["differs_from_fp32"], "fp16 on the wire must round the gradients"


def test_own_hook_sees_every_bucket_and_can_delegate(hooks):
    n, res = hooks
    for rec in _all(res, "watch", n):
        assert rec["same_as_default"], "delegating to allreduce_hook must change nothing"
        assert rec["calls"] == rec["expected_calls"]
        assert rec["indices"] == list(range(len(rec["indices"]))) and len(rec["indices"]) >= 2
        assert rec["last"] == [False] * (len(rec["last"]) - 1) + [True]
        assert rec["params"] == rec["model_params"]  # every parameter in exactly one bucket


def test_hook_from_scratch_with_then(hooks):
    n, res = hooks
    for rec in _all(res, "sum_hook", n):
        assert rec["identical"] and rec["max_diff_default"] < 1e-6, rec


def test_bfloat16_model_averages_in_float32(hooks):
    n, res = hooks
    for rec in _all(res, "bfloat16", n):
        assert rec["dtype"] == "torch.bfloat16" and rec["identical"], rec
        assert rec["buckets"] >= 2
        assert rec["rel_err"] < 2e-2, rec  # bfloat16 keeps ~3 significant digits


def test_misuse_gives_clear_errors(hooks):
    n, res = hooks
    for rec in _all(res, "misuse", n):
        errors = rec["errors"]
        assert "compression=None" in errors["after_option"]
        assert (
            errors["not_callable"].startswith("TypeError")
            and "hook(state, bucket)" in (errors["not_callable"])
        )
        assert "at most one" in errors["twice"]
        assert "comm hook" in errors["wrong_value"] and "same size" in errors["wrong_value"]
