"""Parameter-server checkpoints: written while training, resumed by a new job."""

from tests.train_async._results import results, run_worker


def test_server_checkpoint_and_resume_continue_training(tmp_path):
    first = results(run_worker(3, "resume", "first", str(tmp_path)))
    second = results(run_worker(3, "resume", "second", str(tmp_path)))

    # the workers' checkpoint requests (at their step 40) reached the server, which
    # wrote its file; it holds this worker's progress as of its last applied push
    # (40, or later when the other worker's request came after this one's next pushes)
    for w in (1, 2):
        epoch, step, gstep = first["peek"][w]["saved_progress"]
        assert 40 <= gstep <= 42 and (epoch, step) == (1, gstep - 30), (epoch, step, gstep)
    server1, server2 = first["first"][0], second["second"][0]
    assert server1["serves"] and server2["serves"]
    for w in (1, 2):
        assert first["first"][w]["crashed"] and first["first"][w]["steps"] == 50
    assert server1["version"] == 2 * 50  # every push of both workers was applied

    # the new job restored the shard, the momentum buffers, the version ...
    assert server2["at_load"]["loaded"]
    assert server2["at_load"]["version"] == server1["version"]
    assert server2["at_load"]["state"] == server1["state"]
    # ... and every worker's place in the data: epoch 1, step 20 (global step 50)
    for w in (1, 2):
        rec = second["second"][w]
        assert rec["at_load"]["loaded"] and rec["at_load"]["progress"] == [1, 20, 50]
        assert rec["steps"] == 4 * 30
        # it went on from the trained model, not from its own fresh weights:
        # the first (resumed) epoch is already far below the first job's first
        resumed_first = rec["losses"][0]
        assert resumed_first < 0.5 * first["first"][w]["losses"][0], rec["losses"]
    assert server2["updates"] == server1["version"] + 2 * (4 * 30 - 50)
    assert server2["eval"]["loss"] < 0.6 and server2["eval"]["accuracy"] > 0.85
