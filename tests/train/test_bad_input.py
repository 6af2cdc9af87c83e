"""Bad input gives a clear error on every rank, naming the ranks, never a hang."""


def test_bad_input_errors_on_every_rank(run_ranks):
    n = 3
    results = run_ranks(n, "bad_input", timeout=120)
    recs = [results[r][0] for r in range(n)]
    for rec in recs:
        e = rec["errors"]
        assert "ReplicaMismatchError" in e["shape"] and "ranks [2]" in e["shape"]
        assert "(16, 8)" in e["shape"] and "(17, 8)" in e["shape"]
        assert "ranks [1]" in e["count"] and "6 parameters (rank 0 has 4)" in e["count"]
        assert "ranks [1]" in e["optimizer"] and "Adam (rank 0 has SGD)" in e["optimizer"]
        assert "not in the model" in e["foreign"]
        assert "rank(s) [1] have no training batches" in e["empty_shard"]
        assert "[6, 4, 4]" in e["uneven"] and "different numbers of batches" in e["uneven"]
        assert "shard empty" in e["too_little_data"] and "uneven='pad'" in e["too_little_data"]
        assert "at least one layer" in e["balance"]
        # identical errors everywhere: all ranks decided together
        assert e == recs[0]["errors"]
        assert not rec["before_same"] and rec["after_same"] and rec["avg_ok"]
