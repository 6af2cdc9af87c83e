"""The hang report's comparison of the ranks' flight recorders (client side).

Each rank's flight recorder (``comm.flight()``, engine side) lists its last
communication calls with a sequence number per group. Collectives run in the same
order on every member, so comparing the numbers across ranks says who waits where
and who is behind, e.g.::

    ranks 0,1,3 wait in all_reduce #57 (world, 4 MiB float32, cell line 12);
    rank 2's last collective in world was #56 (all_reduce, cell line 12), and it is
    at cell line 15.

and the same number with a different op or size is a mismatch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from clusterkernel.client.cluster._stacks import cell_lines, is_cell, request_state
from clusterkernel.client.errors import rank_label
from clusterkernel.protocol._calls import SIZED_CALLS
from clusterkernel.protocol.records import human_bytes

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster


def place(entry: dict) -> str:
    """Where a call was made: ``cell line 12`` or ``train.py:40``."""
    path = entry.get("file") or ""
    if not path:
        return ""  # torch's recorder without stacks: the line of a finished call
    if is_cell(entry):
        return f"cell line {entry['line']}"
    return f"{os.path.basename(path)}:{entry['line']}"


def _what(e: dict) -> str:
    size = (
        f"{human_bytes(e['nbytes'])} {e['dtype']}".strip()
        if e["dtype"]
        else human_bytes(e["nbytes"])
    )
    where = place(e)
    return f"{e['op']} #{e['seq']} ({e['group']}, {size}{', ' + where if where else ''})"


# Rooted calls whose recorded size differs by role in torch's flight recorder: only the
# root records scatter's list and gather's outputs (a non-root rank's reads 0 B).
_ROOTED = {"scatter", "gather"}


def _signature(e: dict) -> tuple:
    sized = e["op"] in SIZED_CALLS and not (e.get("torch") and e["op"] in _ROOTED)
    return (e["op"], e["dtype"] if sized else "", e["nbytes"] if sized else -1)


def compare(flights: dict[int, list[dict]], positions: dict[int, str] | None = None) -> str:
    """Compare the ranks' flight records; empty when no rank waits in a call.

    ``flights`` maps rank -> its ``comm.flight()`` entries; ``positions`` maps
    rank -> where it is now (``it is at cell line 15``, ``it has finished the cell``).
    """
    positions = positions or {}
    lines: list[str] = []
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for rank, entries in flights.items():
        for e in entries:
            if e.get("peer") is None and e["seq"] >= 0:
                # one cell's new_group() is not the last cell's, though named alike
                key = (e["group"], tuple(e["group_ranks"]), e.get("group_instance", 0))
                groups.setdefault(key, {}).setdefault(rank, []).append(e)
    for (name, members, _), per_rank in sorted(groups.items()):
        lines += _compare_group(name, members, per_rank, flights, positions)
    lines += _pending_p2p(flights)
    return "\n".join(lines)


# The op of a flight entry for auto's first-use set-up (comm/_auto.py SETUP_LABEL). It
# shares its number with the call it precedes, so it is no call of its own to compare.
_SETUP = "auto set-up for "


def _compare_group(name, members, per_rank, flights, positions) -> list[str]:
    # the latest entry of the highest number: a set-up entry and its call share one
    last = {r: max(reversed(es), key=lambda e: e["seq"]) for r, es in per_rank.items()}
    waiting = {r: e for r, e in last.items() if not e["done"]}
    if not waiting:
        return []
    lines = []
    mismatch = _mismatch(name, per_rank)
    if mismatch:
        lines.append(mismatch)
    by_call: dict[str, list[int]] = {}
    for r, e in sorted(waiting.items()):
        by_call.setdefault(_what(e), []).append(r)
    for what, ranks in by_call.items():
        verb = "waits" if len(ranks) == 1 else "wait"
        lines.append(f"{rank_label(ranks)} {verb} in {what}")
    front = max(e["seq"] for e in waiting.values())
    for r in members:
        if r in waiting or r not in flights:
            continue  # waiting ranks are named above; unknown ranks did not answer
        e = last.get(r)
        now = positions.get(r)
        tail = f", and {now}" if now else ""
        if e is None:
            lines.append(f"rank {r} has made no collective call in {name}{tail}")
        elif e["seq"] < front:
            lines.append(
                f"rank {r}'s last collective in {name} was #{e['seq']} ({e['op']}"
                f"{', ' + place(e) if place(e) else ''}){tail}"
            )
    return lines


def _mismatch(name: str, per_rank: dict[int, list[dict]]) -> str:
    """The highest sequence number where ranks made different calls, if any."""
    by_seq: dict[int, dict[int, dict]] = {}
    for r, es in per_rank.items():
        for e in es:
            if not e["op"].startswith(_SETUP):
                by_seq.setdefault(e["seq"], {})[r] = e
    for seq in sorted(by_seq, reverse=True):
        calls = by_seq[seq]
        variants: dict[tuple, list[int]] = {}
        for r, e in sorted(calls.items()):
            variants.setdefault(_signature(e), []).append(r)
        if len(variants) > 1:
            parts = []
            for _, ranks in sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1])):
                e = calls[ranks[0]]
                size = (
                    f"{e['dtype']}, {human_bytes(e['nbytes'])}"
                    if e["dtype"]
                    else human_bytes(e["nbytes"])
                )
                parts.append(f"{rank_label(ranks)} called {e['op']} ({size})")
            return f"mismatch at {name} #{seq}: " + "; ".join(parts)
    return ""


def _pending_p2p(flights: dict[int, list[dict]]) -> list[str]:
    lines = []
    for rank, entries in sorted(flights.items()):
        for e in entries:
            if e.get("peer") is not None and not e["done"]:
                peer = {-1: "any rank", -2: "a peer (torch does not record it)"}.get(
                    e["peer"], f"rank {e['peer']}"
                )
                direction = "to" if e["op"].startswith("send") else "from"
                lines.append(
                    f"rank {rank} waits in {e['op']} {direction} {peer} "
                    f"({human_bytes(e['nbytes'])}, {place(e)})"
                )
    return lines


def has_torch_calls(flights: dict[int, list[dict]]) -> bool:
    """Whether any rank's flight records (from :func:`collect`) hold torch.distributed calls."""
    return any(e.get("torch") for entries in flights.values() for e in entries)


def collect(
    cluster: Cluster, ranks: list[int], busy: list[int]
) -> tuple[dict[int, list[dict]], dict[int, str]]:
    """Each answering rank's flight records (comm's and torch's), and where each rank is:
    the arguments of :func:`compare`.

    Ranks still running are asked through their control channel, so this works while
    they are blocked in MPI and on any host; ranks that finished the cell answer too.
    """
    state = request_state(cluster.client, {r: cluster.engine_id(r) for r in ranks})
    positions = {}
    for r in ranks:
        if r not in busy:
            positions[r] = "it has finished the cell"
        elif r in state:
            lines = cell_lines(state[r].get("frames", []))
            if lines:
                positions[r] = f"it is at cell line {lines[-1]}"
    return {r: s.get("flight", []) for r, s in state.items()}, positions
