"""RESULT lines: how a worker script on real ranks reports values, and how a test reads them.

A worker (run by :func:`tests._mpirun.run_mpi`, which puts the repository on the
ranks' ``PYTHONPATH``) prints one JSON line per result, tagged with its rank; the test
parses the job's output and groups the records::

    # in the worker, on every rank
    from tests._results import report
    report(scenario="allreduce", loss=0.25)    # RESULT {"rank": 1, "scenario": ..., ...}

    # in the test
    records = parse_results(run_mpi(3, "worker.py").stdout)
    by_rank(records, 3)[1]                      # [{"rank": 1, "scenario": ...}, ...]
    by_scenario(records)["allreduce"][1]["loss"]  # 0.25
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable

TAG = "RESULT "


def report(**values) -> None:
    """Print one ``RESULT`` line with this rank and ``values`` (JSON-able), flushed at once."""
    from clusterkernel import comm  # the ranks' side only: the test process never calls it

    print(TAG + json.dumps({"rank": comm.rank(), **values}), flush=True)
    sys.stdout.flush()


def params_hash(model) -> str:
    """SHA-256 of a torch module's parameters, to compare replicas across ranks exactly."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def parse_results(text: str) -> list[dict]:
    """The records of every ``RESULT`` line in ``text`` (all ranks' output), in order."""
    return [json.loads(line[len(TAG) :]) for line in text.splitlines() if line.startswith(TAG)]


def by_rank(records: Iterable[dict], n: int) -> dict[int, list[dict]]:
    """``{rank: [record, ...]}`` for ranks ``0 .. n-1`` (a silent rank gets ``[]``)."""
    out: dict[int, list[dict]] = {r: [] for r in range(n)}
    for rec in records:
        out[rec["rank"]].append(rec)
    return out


def by_scenario(records: Iterable[dict]) -> dict[str, dict[int, dict]]:
    """``{scenario: {rank: record}}``; a rank's later record of a scenario wins."""
    out: dict[str, dict[int, dict]] = {}
    for rec in records:
        out.setdefault(rec["scenario"], {})[rec["rank"]] = rec
    return out
