"""Each mode saves and restores its own state (see workers/mode_state.py): the
replicated file of allreduce, the gathered one of local, gossip and synchronous
EASGD, each rank getting its own model, optimizer and mode state back."""

import pytest

from tests.train_async._results import results, run_worker

N = 3


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return results(run_worker(N, "mode_state", str(tmp_path_factory.mktemp("mode_state"))))


@pytest.mark.parametrize("name", ["allreduce", "local", "gossip", "easgd"])
def test_every_rank_gets_its_own_state_back(res, name):
    recs = res[name]
    assert sorted(recs) == list(range(N))
    for rec in recs.values():
        assert rec["loaded"] and rec["changed"], rec
        assert rec["restored"] == rec["saved"], rec
        assert rec["progress"] == [1, 0, 30]
    models = {rec["saved"]["model"] for rec in recs.values()}
    # allreduce and synchronous EASGD (whose model is the center after fit) end
    # with one model; local and gossip without the final average keep three
    assert len(models) == (1 if name in ("allreduce", "easgd") else N), models


@pytest.mark.parametrize(
    "name, replicated, mode_keys",
    [("allreduce", True, [[]]), ("local", False, [[]] * N), ("gossip", False, [["weight"]] * N),
     ("easgd", False, [["center"]] * N)],
)  # fmt: skip
def test_file_layout(res, name, replicated, mode_keys):
    layout = res[name][0]["layout"]
    assert layout["replicated"] is replicated
    assert layout["states"] == (1 if replicated else N)
    assert layout["keys"] == ["mode", "model", "optimizer"]
    assert layout["mode_keys"] == mode_keys
    if name == "gossip":  # the weights were not averaged away: they differ per rank
        assert len({rec["saved"]["mode"] for rec in res[name].values()}) > 1
