"""The two-node Slurm test bed, once per test session (see ``_testbed.py``).

Tests that need it skip, saying why, where the machine cannot host it (not root,
Slurm's programs missing, no network namespaces); CI installs Slurm (the README's
test command) and runs them all.
"""

from __future__ import annotations

import os

import pytest

from tests.slurm._testbed import SlurmTestbed, missing_programs


@pytest.fixture(scope="session")
def slurm_testbed():
    if os.geteuid() != 0:
        pytest.skip("the Slurm test bed needs root (daemons, network namespaces)")
    missing = missing_programs()
    if missing:
        pytest.skip(
            f"the Slurm test bed needs {', '.join(missing)}: apt-get install slurmctld slurmd "
            "slurm-client munge libpmix-dev (the README's test command does)"
        )
    bed = SlurmTestbed()
    saved = dict(os.environ)
    try:
        try:
            bed.start()
        except Exception as e:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (bed.base / "log").glob("*.log")
            )
            pytest.fail(f"the Slurm test bed did not start: {e}\n{logs}")
        # Clusters started by the tests inherit it, as a login node's environment
        os.environ.update(bed.env)
        yield bed
    finally:
        os.environ.clear()
        os.environ.update(saved)
        bed.stop()
