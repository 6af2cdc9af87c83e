"""Each rank's output as one ordered list of messages, and which of them ranks share.

:class:`RankEntries` turns one rank's growing stdout, stderr and rich outputs into
*entries* in the order they arrived: a line, or a multi-line message written at
once (a warning and its source line, a traceback, a logging record's continuation:
lines that start with whitespace belong to the message above them), or one rich
output. stdout and stderr reach the client as two separate texts; entries that
arrive in the same poll keep stdout before stderr, entries of later polls come later.

:class:`Sharing` lines the ranks' lists up by position and finds, for each rank, the
longest *shared prefix*: entries that at least one other rank, itself still sharing,
has at the same position with the same content. Only a rank's shared prefix goes to
the shared area; everything from its first entry of its own onwards stays in its own
area, so no area ever shows a rank's message before one the rank printed earlier.

Example::

    a, b = RankEntries(), RankEntries()
    a.ingest(RankOutput(stdout="epoch 0\\nloss 0.5\\n"), now=0.0)
    b.ingest(RankOutput(stdout="epoch 0\\nloss 0.7\\n"), now=0.0)
    s = Sharing()
    s.update({0: a, 1: b})
    s.prefix        # {0: 1, 1: 1}: "epoch 0" is shared, the losses are not
    s.groups[0]     # [[0, 1]]
"""

from __future__ import annotations

import json

from clusterkernel.client.output._rank_output import RankOutput

TEXT_KINDS = ("stdout", "stderr")


def _continues(line: str) -> bool:
    """Whether ``line`` belongs to the message above it (indented: a warning's source
    line, a traceback's frames, a wrapped log record)."""
    return line[:1] in (" ", "\t")


class RankEntries:
    """One rank's entries: ``kinds[i]`` ("stdout", "stderr", "output", "result"),
    ``keys[i]`` (the text, or a rich output's data as JSON), ``born[i]`` (when it
    first arrived), ``contents[i]`` (a rich output's content, else None)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.keys: list[str] = []
        self.born: list[float] = []
        self.contents: list[dict | None] = []
        self._seen = dict.fromkeys(("stdout", "stderr", "output", "result"), 0)
        self._open: dict[str, int] = {}  # stream -> its entry that may still grow
        self._partial: dict[str, bool] = {}  # stream -> its open entry lacks a newline
        self._in_traceback: dict[str, bool] = {}
        self.changed_from: int | None = None  # first index changed since taken

    def __len__(self) -> int:
        return len(self.keys)

    def take_changes(self) -> int | None:
        """The first index that changed since the last call (None: nothing did)."""
        first, self.changed_from = self.changed_from, None
        return first

    def _changed(self, index: int) -> None:
        self.changed_from = index if self.changed_from is None else min(self.changed_from, index)

    def _append(self, kind: str, key: str, now: float, content: dict | None = None) -> int:
        self.kinds.append(kind)
        self.keys.append(key)
        self.born.append(now)
        self.contents.append(content)
        self._changed(len(self.keys) - 1)
        return len(self.keys) - 1

    def _extend(self, index: int, more: str) -> None:
        self.keys[index] += more
        self._changed(index)

    def ingest(self, out: RankOutput, now: float) -> None:
        """Take in what is new in ``out`` (the rank's whole output so far)."""
        for kind in TEXT_KINDS:
            text = out.stdout if kind == "stdout" else out.stderr
            seen = self._seen[kind]
            if len(text) > seen:
                self._seen[kind] = len(text)
                self._text(kind, text[seen:], now)
        result = [out.execute_result] if out.execute_result else []
        for kind, contents in (("output", out.outputs), ("result", result)):
            for content in contents[self._seen[kind] :]:
                key = json.dumps(content.get("data", {}), sort_keys=True)
                self._append(kind, key, now, content)
            self._seen[kind] = max(self._seen[kind], len(contents))

    def _text(self, kind: str, new: str, now: float) -> None:
        lines = new.split("\n")
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last and not line:
                break  # the text ended with its newline
            open_entry = self._open.get(kind)
            is_last_entry = open_entry is not None and open_entry == len(self.keys) - 1
            if open_entry is not None and self._partial.get(kind):
                self._extend(open_entry, line)  # the rest of a line begun in an earlier poll
            elif (
                open_entry is not None
                and is_last_entry
                and (_continues(line) or self._in_traceback.get(kind))
            ):
                # part of the message above: a traceback runs to its first unindented line
                self._extend(open_entry, "\n" + line)
                if self._in_traceback.get(kind) and not _continues(line):
                    self._in_traceback[kind] = False
            else:
                self._open[kind] = self._append(kind, line, now)
                self._in_traceback[kind] = line.startswith("Traceback (most recent call last)")
            self._partial[kind] = last


class Sharing:
    """Which ranks share which entries (see the module): ``prefix[rank]`` (the length of
    its shared prefix) and ``groups[i]`` (the rank groups sharing entry ``i``, lowest
    rank first), kept up to date incrementally from the first changed position."""

    def __init__(self) -> None:
        self.prefix: dict[int, int] = {}
        self.groups: list[list[list[int]]] = []
        self._active: list[frozenset[int]] = []  # ranks still sharing when entry i begins

    def update(self, ranks: dict[int, RankEntries]) -> int | None:
        """Recompute from the first position any rank changed; that position (or None)."""
        changed = [c for c in (e.take_changes() for e in ranks.values()) if c is not None]
        if set(self.prefix) != set(ranks):
            changed.append(0)  # other ranks: everything again
        if not changed:
            return None
        start = min(min(changed), len(self._active))
        # the ranks still sharing as position ``start`` begins depend only on what is before it
        if start == 0:
            active = frozenset(ranks)
        elif start < len(self._active):
            active = self._active[start]
        else:
            active = frozenset(r for g in self.groups[start - 1] for r in g)
        del self.groups[start:]
        del self._active[start:]
        prefix = {r: p for r, p in self.prefix.items() if p < start and r in ranks}
        index = start
        while active:
            self._active.append(active)
            by_key: dict[tuple[str, str], list[int]] = {}
            for r in sorted(active):
                entries = ranks[r]
                if index < len(entries):
                    by_key.setdefault((entries.kinds[index], entries.keys[index]), []).append(r)
            groups = [g for g in by_key.values() if len(g) >= 2]
            self.groups.append(sorted(groups))
            still = frozenset(r for g in groups for r in g)
            for r in active - still:
                prefix[r] = index
            active = still
            index += 1
        self.prefix = prefix
        return start
