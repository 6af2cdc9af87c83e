"""Per-rank pytest setup for the MPI case files: keep every rank in step."""

from __future__ import annotations

import pytest
from _helpers import WORLD


@pytest.fixture(autouse=True)
def _in_step():
    # Each case starts and ends together on all ranks, so a case that fails on one
    # rank cannot leave the others inside a collective of the next case.
    WORLD.Barrier()
    yield
    WORLD.Barrier()


def pytest_runtest_logreport(report):
    # Print a failure at once: if the other ranks then hang, the job is killed
    # before pytest's end-of-run summary, and this is the only trace of the cause.
    if report.failed:
        print(
            f"\nFAILED on rank {WORLD.Get_rank()}: {report.nodeid}\n{report.longreprtext}",
            flush=True,
        )
