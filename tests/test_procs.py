"""The tests' process counting sees only what this test session started: a cluster
of someone else's on the same machine (a notebook's engines, a job's mpiexec) must
neither block the tests nor be taken for one the tests left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil
import pytest

from tests._procs import SESSION, SESSION_VAR, cluster_processes, wait_no_cluster_processes


def _lookalike(env: dict[str, str]) -> subprocess.Popen:
    """A sleeping Python whose command line reads like an ipyparallel engine's."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "-m", "ipyparallel.engine"], env=env)


@pytest.fixture
def lookalikes():
    procs: list[subprocess.Popen] = []

    def start(env):
        procs.append(_lookalike(env))
        return procs[-1]

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _pids() -> set[int]:
    return {p.pid for p in cluster_processes()}


def test_session_marker_is_in_the_environment_children_inherit():
    assert os.environ[SESSION_VAR] == SESSION
    assert len(SESSION) >= 32  # a uuid: unique per session


def test_engines_started_outside_the_session_are_ignored(lookalikes):
    clean = {k: v for k, v in os.environ.items() if k != SESSION_VAR}
    outsider = lookalikes(clean)
    other_session = lookalikes({**os.environ, SESSION_VAR: uuid.uuid4().hex})
    ours = lookalikes(dict(os.environ))
    for p in (outsider, other_session, ours):  # all three look like engines
        assert "ipyparallel.engine" in " ".join(psutil.Process(p.pid).cmdline())
    found = _pids()
    assert ours.pid in found  # the helper does see an engine the tests started
    assert outsider.pid not in found and other_session.pid not in found
    ours.kill()
    ours.wait()
    # with only the others' left, waiting for "no cluster" returns at once, empty
    left = wait_no_cluster_processes(5)
    assert not {p.pid for p in left} & {outsider.pid, other_session.pid}
    assert outsider.poll() is None and other_session.poll() is None  # still running
