"""Read the renderers' rank labels back: ``[ranks 0-2,5] text`` -> one line per rank."""

from __future__ import annotations

import re

_LABEL = re.compile(r"^(?:Out)?\[ranks? ([0-9,\-]+)(?: (\w+))?\]:? ?(.*)$")


def parse_ranks(spec: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (the inverse of ``errors.format_ranks``)."""
    ranks: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        ranks += range(int(lo), int(hi or lo) + 1)
    return ranks


def per_rank_lines(text: str) -> list[tuple[int, str]]:
    """Each labelled line of terminal output, once for every rank its label names."""
    out = []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            out += [(r, m.group(3)) for r in parse_ranks(m.group(1))]
    return out
