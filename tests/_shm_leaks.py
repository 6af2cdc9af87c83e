"""Which test leaves Open MPI shared-memory segments behind in /dev/shm.

Open MPI's shared-memory transport makes one ``sm_segment.*`` file per rank and
unlinks it when the rank ends its MPI cleanly; a rank that is killed leaves it. A test
that kills ranks on purpose must still not leave the machine with files nobody will
remove, so each test's new segments that outlive it are named in the summary (and in
``test-artifacts/shm-leaks.txt``) for the next person to chase.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_SHM = Path("/dev/shm")
_leaks: dict[str, list[str]] = {}
_before: set[str] = set()


def segments() -> set[str]:
    """The ``sm_segment.*`` files of this user in /dev/shm now."""
    try:
        return {
            p.name
            for p in _SHM.iterdir()
            if p.name.startswith("sm_segment.") and p.stat().st_uid == os.getuid()
        }
    except OSError:
        return set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _before
    _before = segments()
    yield
    left = sorted(segments() - _before)
    if left:
        _leaks[item.nodeid] = left


def pytest_terminal_summary(terminalreporter):
    # only what outlived the session: the shared cluster's segments outlive the test
    # that started it and go when the session's fixtures stop it
    still = segments()
    lines = [
        f"{nodeid}: {' '.join(left)}"
        for nodeid, names in _leaks.items()
        if (left := [n for n in names if n in still])
    ]
    if not lines:
        return
    terminalreporter.write_sep("-", "Open MPI segments left in /dev/shm, by test")
    for line in lines:
        terminalreporter.write_line(line)
    out = Path("test-artifacts")
    out.mkdir(exist_ok=True)
    (out / "shm-leaks.txt").write_text("\n".join(lines) + "\n")
