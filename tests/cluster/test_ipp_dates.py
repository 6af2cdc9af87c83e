"""The faster reader of ipyparallel's reply timestamps reads what ipyparallel's own does."""

from __future__ import annotations

import warnings

import pytest
from ipyparallel import util

from clusterkernel.cluster import _ipp_dates


@pytest.mark.parametrize(
    "s",
    [
        "2026-11-22T19:59:48.123456Z",
        "2026-11-22T19:59:48Z",
        "2026-11-22T19:59:48.123456+01:00",
        "2026-11-22T19:59:48.123456",
        "2026-11-22T19:59:48.1Z",
        "not a date",
        "",
        None,
    ],
)
def test_same_value_as_ipyparallel(s):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert _ipp_dates.parse_date(s) == _ipp_dates._ORIGINAL(s)


def test_install_replaces_ipyparallels_reader_once(monkeypatch):
    monkeypatch.setattr(util, "_parse_date", _ipp_dates._ORIGINAL)
    _ipp_dates.install()
    _ipp_dates.install()
    assert util._parse_date is _ipp_dates.parse_date
