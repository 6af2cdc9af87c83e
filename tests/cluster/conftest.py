"""Fixtures of the cluster tests that more than one module uses."""

from __future__ import annotations

import pytest

from tests._netns import NoSecondHost, second_host


@pytest.fixture(scope="module")
def netns_host():
    """A second "machine": a network namespace at .2 of a free subnet (tests/_netns.py)."""
    try:
        with second_host() as host:
            yield host
    except NoSecondHost as exc:
        pytest.skip(str(exc))
