"""The metric stream on real MPI ranks: complete, never blocking the loop, authenticated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from clusterkernel.client.dashboard import MetricsStore, Receiver
from clusterkernel.client.mpiexec import MPIRuntime
from clusterkernel.protocol import _wire
from clusterkernel.protocol.records import COMM_FIELDS

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "workers" / "stream_ranks.py"


def _start_ranks(n: int, rx: Receiver, steps: int, out_dir: Path, max_batch: int):
    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = str(REPO)
    env["OMP_NUM_THREADS"] = "1"
    env["CK_TEST_KEY"] = rx.key.hex()
    cmd = [*rt.command(n), sys.executable, str(WORKER), rx.address, str(steps), str(out_dir)]
    return subprocess.Popen(
        [*cmd, str(max_batch)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _lines(proc, want: dict[str, int], timeout: float) -> dict[str, list[dict]]:
    """Read stdout until ``want[prefix]`` lines start with each prefix (ranks print
    theirs interleaved); fail on exit or timeout."""
    found: dict[str, list[dict]] = {prefix: [] for prefix in want}
    deadline = time.monotonic() + timeout
    while any(len(found[p]) < count for p, count in want.items()):
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"ranks exited before {want}: {proc.stderr.read()}")
        prefix, _, rest = line.partition(" ")
        if prefix in found:
            found[prefix].append(json.loads(rest))
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"not {want} from the ranks within {timeout}s")
    return found


def test_fast_loop_never_waits_for_a_slow_notebook_and_nothing_is_lost(tmp_path):
    """The notebook reads nothing until every rank's loop is done; then all arrives."""
    n, steps = 4, 30_000
    store = MetricsStore()
    rx = Receiver(store)  # bound, but its thread is not reading yet
    # one record per message: ~30,000 messages per rank, more than ZMQ and TCP queue, so
    # the publishers must hold back and retry (full_waits) rather than drop or block
    proc = _start_ranks(n, rx, steps, tmp_path, max_batch=1)
    try:
        # every publisher ran into the full socket and held back, still unread: how
        # much the kernel buffers first depends on its TCP autotuning, so wait for it
        got = _lines(proc, {"LOGGED": n, "BLOCKED": n}, timeout=180)
        logged, blocked = got["LOGGED"], got["BLOCKED"]
        assert store.messages == 0  # the loops finished while nothing was read
        assert all(b["full_waits"] > 0 for b in blocked), blocked  # and they held back
        rx.start()
        flushed = _lines(proc, {"FLUSHED": n}, timeout=120)["FLUSHED"]
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        rx.stop()
    assert store.wait_for({f["rank"]: f["seq"] for f in flushed}, timeout=30)
    for info in logged:
        rank = info["rank"]
        expected = json.loads((tmp_path / f"rank{rank}.json").read_text())
        got = store.records(ranks=[rank])
        assert len(got) == sum(info["totals"].values())
        assert got == expected  # every record, in order, values intact
        steps_seen = [r["step"] for r in got if r["kind"] == "scalar"]
        assert steps_seen == [-1, *range(steps)]  # logged before the stream started too
        st = store.status()[rank]
        assert st["lost"] == 0 and st["gaps"] == 0
        assert st["pid"] > 0 and st["host"]
    assert rx.rejected == 0
    series = store.series("loss")
    assert sorted(series) == list(range(n))
    assert series[2][1][1] == pytest.approx(1.0 + 2)  # step 0 of rank 2
    ops = {(r["rank"], r["op"]): r["count"] for r in store.comm_table()}
    assert all(ops[(r, "all_reduce")] == steps // 1000 for r in range(n))


def test_receiver_refuses_messages_not_signed_with_its_key():
    store = MetricsStore()
    rx = Receiver(store).start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(rx.address)
    good = {
        "v": _wire.VERSION,
        "rank": 0,
        "seq": 1,
        "pc": 1.0,
        "wall": 2.0,
        "scalar": [[0, 1.0, {"loss": 1}]],
    }
    try:
        push.send_multipart(_wire.encode(b"wrong key", good))
        push.send_multipart([b"no signature"])
        push.send_multipart(_wire.encode(rx.key, {**good, "v": 99}))
        push.send_multipart(_wire.encode(rx.key, good))
        assert store.wait_for({0: 1}, timeout=10)
        deadline = time.monotonic() + 5
        while rx.rejected < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        push.close()
        ctx.term()
        rx.stop()
    assert rx.rejected == 3 and rx.received == 1
    assert store.records() == [
        {"kind": "scalar", "rank": 0, "step": 0, "time": 1.0, "values": {"loss": 1}}
    ]


def test_wire_decode_errors_say_what_is_wrong():
    with pytest.raises(_wire.WireError, match="bad signature"):
        _wire.decode(b"k", [b"x" * 32, b"{}"])
    with pytest.raises(_wire.WireError, match="a signature and a header"):
        _wire.decode(b"k", [b"{}"])
    frames = _wire.encode(
        b"k", {"v": _wire.VERSION, "rank": 0, "scalar": [(0, 1.0, {"loss": 1.0})]}
    )
    frames[-1] = frames[-1][:-1] + b"\x00"  # one byte of a column changed
    with pytest.raises(_wire.WireError, match="bad signature"):
        _wire.decode(b"k", frames)


def test_wire_round_trip_is_exact_for_every_record_shape():
    msg = {
        "v": _wire.VERSION,
        "rank": 3,
        "seq": 2,
        "lost": {"comm": 1},
        "scalar": [(0, 0.1, {"loss": 0.1 + 0.2}), (1, 0.2, {"loss": float("inf"), "acc": 0.5})],
        "comm": [("all_reduce", 2**40, "ring", 4, 1.5, 1e-9, 0.0)],
        "span": [("forward", 3.25, 0.001)],
    }
    back = _wire.decode(b"k", _wire.encode(b"k", msg))
    assert back == {**msg, "seq": 2}
    # the comm columns are the record layout's fields, by its names, in its order
    cols = _wire.decode(b"k", _wire.encode(b"k", msg), columns=True)["comm"]
    assert [k for k in cols if k != "n"] == list(COMM_FIELDS), list(cols)
    assert cols["algorithm"].tolist() == ["ring"]
    floaty = {
        "v": _wire.VERSION,
        "rank": 0,
        "scalar": [(2.5, 0.0, {"x": 1.0}), (3, 0.0, {"x": 2.0})],
    }
    assert _wire.decode(b"k", _wire.encode(b"k", floaty))["scalar"] == floaty["scalar"]
