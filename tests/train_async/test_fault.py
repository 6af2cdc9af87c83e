"""A killed worker does not stop a parameter-server run (Open MPI fault tolerance).

The job runs with Open MPI's ULFM fault tolerance switched on (the environment
equivalent of ``mpiexec --with-ft ulfm``); one worker SIGKILLs itself mid-run.
"""

from tests.train_async._results import results, run_worker

STEPS = 6 * 30


def test_killed_worker_does_not_stop_the_parameter_server(tmp_path):
    run = run_worker(4, "fault", str(tmp_path), fault_tolerant=True, timeout=120)
    res = results(run)
    assert res["victim"][2]["step"] == 40  # it really was killed mid-run...
    survivors = res["survivor"]
    assert sorted(survivors) == [0, 1, 3]  # ...and never got to report the end
    server = survivors[0]
    assert server["serves"]
    # the server noticed, logged it (metric and log line), and finished with the others
    assert server["stats"]["failed_workers"] == [2]
    assert server["failures_logged"] == [2]
    assert "worker rank 2 failed" in run.stderr
    updates = server["stats"]["updates"]
    assert 2 * STEPS + 35 <= updates <= 2 * STEPS + 41, updates  # the victim's ~40 pushes
    assert server["stats"]["max_staleness"] <= 1  # the bound held, and did not block
    workers = [survivors[1], survivors[3]]
    for rec in workers:
        assert rec["steps"] == STEPS
        assert rec["local_eval"]["loss"] < 0.6 and rec["local_eval"]["accuracy"] > 0.85, rec
    # both survivors ended with the server's final parameters
    assert workers[0]["hash"] == workers[1]["hash"] == server["hash"]
    assert (tmp_path / "checkpoint.server0.pt").is_file()
