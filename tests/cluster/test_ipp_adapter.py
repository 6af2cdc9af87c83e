"""The ipyparallel adapter: its faster reader of reply timestamps reads what
ipyparallel's own does, and importing clusterkernel leaves ipyparallel as it is."""

from __future__ import annotations

import warnings

import pytest
from ipyparallel import util

from clusterkernel.client.cluster import _ipp


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
        assert _ipp.parse_date(s) == _ipp._ORIGINAL(s)


def test_install_replaces_ipyparallels_reader_once(monkeypatch):
    monkeypatch.setattr(util, "_parse_date", _ipp._ORIGINAL)
    _ipp.install_date_parser()
    _ipp.install_date_parser()
    assert util._parse_date is _ipp.parse_date


def test_importing_clusterkernel_leaves_ipyparallel_as_it_is():
    import subprocess
    import sys

    code = (
        "import clusterkernel, clusterkernel.client.cluster, clusterkernel.client.magics\n"
        "from clusterkernel import Cluster\n"
        "from ipyparallel import util\n"
        "from clusterkernel.client.cluster import _ipp\n"
        "print(util._parse_date is _ipp._ORIGINAL)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
