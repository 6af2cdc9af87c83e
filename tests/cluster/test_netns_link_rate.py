"""``second_host(link_rate=...)``: the two-host bed's link capped by tc tbf both ways.

The cap models an inter-node link slower than memory (benchmarks/bench_hier.py
``--link-rate``). Checks that both ends of the veth pair carry the token bucket at
the asked rate, that nothing is left once the namespace is gone, and that a bad
rate is refused before anything is made.
"""

from __future__ import annotations

import subprocess

import pytest

from tests._netns import NoSecondHost, ip, rate_bits, second_host, which


def _qdiscs(*where: str) -> str:
    return subprocess.run(
        [which("tc"), *where, "qdisc", "show"], capture_output=True, text=True, check=True
    ).stdout


def test_both_ends_are_capped_and_the_caps_go_with_the_namespace():
    try:
        with second_host(link_rate="1gbit") as host:
            peer = "ckn" + host.veth.removeprefix("ckh")
            here = [q for q in _qdiscs().splitlines() if f"dev {host.veth} " in q]
            there = [q for q in _qdiscs("-n", host.ns).splitlines() if f"dev {peer} " in q]
            veth = host.veth
    except NoSecondHost as exc:
        pytest.skip(str(exc))
    for lines in (here, there):
        assert len(lines) == 1 and " tbf " in lines[0] and "rate 1Gbit" in lines[0], lines
    assert ip("link", "show", veth, check=False).returncode != 0  # the pair is gone
    assert f"dev {veth} " not in _qdiscs()


def test_a_bad_rate_is_refused_before_anything_is_made():
    before = ip("netns", "list").stdout
    with pytest.raises(ValueError, match="e.g. 10gbit"):
        with second_host(link_rate="fast"):
            pass
    assert ip("netns", "list").stdout == before
    assert rate_bits("10gbit") == 10**10 and rate_bits("2.5gbit") == 25 * 10**8
