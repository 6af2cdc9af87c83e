"""The engine-side recorder on its own (no MPI needed)."""

from __future__ import annotations

import time

import pytest

from clusterkernel import metrics
from clusterkernel.metrics import Recorder


def test_log_span_and_records_shapes():
    rec = Recorder(rank=3)
    rec.log(step=1, loss=0.5, acc=0.9)
    rec.log(loss=0.25)  # step counts on from the last one
    with rec.span("forward"):
        time.sleep(0.001)
    rec.timing("all_reduce", 4096, start=1.0, duration=2e-5, wait=2e-5, group_size=4)
    out = rec.records()
    assert [r["kind"] for r in out] == ["comm", "scalar", "scalar", "span"]
    assert out[0] == {
        "kind": "comm",
        "rank": 3,
        "op": "all_reduce",
        "nbytes": 4096,
        "algorithm": "mpi",
        "group_size": 4,
        "start": 1.0,
        "duration": 2e-5,
        "wait": 2e-5,
    }
    assert out[1]["values"] == {"loss": 0.5, "acc": 0.9} and out[1]["step"] == 1
    assert out[2]["step"] == 2 and out[2]["values"] == {"loss": 0.25}
    assert out[3]["name"] == "forward" and out[3]["duration"] >= 0.001


def test_drain_returns_only_new_records():
    rec = Recorder(rank=0)
    rec.log(step=0, loss=1.0)
    assert len(rec.drain()) == 1
    assert rec.drain() == []
    rec.log(step=1, loss=0.5)
    new = rec.drain("scalar")
    assert [r["step"] for r in new] == [1]
    assert len(rec.records()) == 2  # records() keeps history


def test_capacity_drops_oldest_and_keeps_cursor_valid():
    rec = Recorder(rank=0, capacity=10)
    for i in range(8):
        rec.log(step=i, x=i)
    assert len(rec.drain()) == 8
    for i in range(8, 12):
        rec.log(step=i, x=i)
    assert len(rec.scalars) <= 10 and rec.dropped["scalar"] > 0
    assert [r["step"] for r in rec.drain()] == [8, 9, 10, 11]


def test_disabled_recorder_records_nothing():
    rec = Recorder(rank=0)
    rec.enabled = False
    rec.log(step=0, loss=1.0)
    with rec.span("x"):
        pass
    rec.timing("push", 64, start=0.0, duration=1e-6)
    assert rec.records() == []


def test_bad_values_are_clear_errors():
    rec = Recorder(rank=0)
    with pytest.raises(TypeError, match="not a number"):
        rec.log(step=0, loss="high")
    with pytest.raises(ValueError, match="at least one value"):
        rec.log(step=0)
    with pytest.raises(ValueError, match="unknown record kind"):
        rec.records("bogus")
    with pytest.raises(ValueError, match="capacity"):
        Recorder(capacity=1)


def test_module_level_log_and_package_export():
    import clusterkernel

    rec = metrics.recorder()
    rec.drain()
    clusterkernel.log(step=5, loss=0.1)
    with metrics.span("backward"):
        pass
    kinds = [r["kind"] for r in rec.drain()]
    assert kinds == ["scalar", "span"]
    assert clusterkernel.metrics.recorder() is rec


def test_tensor_scalars_are_converted():
    torch = pytest.importorskip("torch")
    rec = Recorder(rank=0)
    rec.log(step=0, loss=torch.tensor(0.5))
    assert rec.records()[0]["values"] == {"loss": 0.5}
