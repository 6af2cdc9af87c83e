"""What a stored notebook holds, and how a fresh run is compared with it.

The notebooks in ``notebooks/`` are committed executed, so GitHub shows their
pictures and each rank's output. :func:`for_storage` turns an executed notebook into
what is committed; :func:`differences` says, cell by cell, where a fresh run differs
from the stored outputs once what changes from run to run is set aside:

- every number (timings, durations, ports, pids, job ids, the losses of asynchronous
  training), hex addresses, the folders of absolute paths (temporary directories, the
  venv), runs of whitespace, ANSI colours, this machine's host name;
- the order of the lines in a run of stream output (several processes write there:
  a batch job's ranks, stdout beside stderr): their sorted list is compared, less the
  lines of :data:`POLLED` (whether a poll catches a short state is timing);
- how the ranks' lines are grouped into the shared and per-rank areas (identical
  lines are shared, so two ranks printing the same timing by chance regroup them):
  the set of lines the ranks printed in a cell is compared instead;
- the pixels of a picture (that a cell shows one, and its ``text/plain``, count);
- live widget state: a widget is stored as :data:`WIDGET_NOTE`, which GitHub shows.

What remains must match: each cell's kinds of outputs in order, their text, the
ranks' lines, errors. Example::

    stored = nbformat.read(path, as_version=4)
    problems = differences(stored, execute(path, workdir))   # "" when they agree
"""

from __future__ import annotations

import base64
import copy
import difflib
import io
import re
import socket

from tests.notebooks._run import code_cells

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    "[live dashboard: an ipywidgets view that draws while the cells run in JupyterLab; not stored]"
)
HOST_NAME = "hostname"  # what this machine's name is stored as

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FOLDERS = re.compile(r"(?<![\w.])(?:/[\w.+~-]+)+/")  # "/tmp/x/work/a.py" -> "…/a.py"
_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")
# Normalized lines that say what a poll happened to see: a job's short states (pending
# while %mpi start --slurm waits, squeue's PENDING / CONFIGURING / COMPLETING)
POLLED = re.compile(r"Slurm job #: pending\b.*|squeue: job # (PENDING|CONFIGURING|COMPLETING)\b.*")
_RANK_HEADER = re.compile(r"\[ranks? [#,\- ]+\]")  # after numbers became "#"
_CARRIAGE_RETURN = re.compile(r"[^\n]*\r(?=[^\n])")  # a line a terminal overwrote
_BACKSPACE = re.compile(r"[^\n]\x08")


def _host_pattern(host: str) -> re.Pattern | None:
    # whole words only: a machine named "vm" leaves "vmstat" alone
    return re.compile(rf"(?<![\w-]){re.escape(host)}(?![\w-])") if len(host) > 1 else None


def _redact(text: str, host: re.Pattern | None) -> str:
    return host.sub(HOST_NAME, text) if host else text


def _terminal(text: str) -> str:
    """``text`` as a terminal shows it: ``\\r`` and backspace applied."""
    while True:
        shorter = _BACKSPACE.sub("", text)
        if shorter == text:
            break
        text = shorter
    return _CARRIAGE_RETURN.sub("", text)


def _smaller_png(b64: str) -> str:
    """The same picture in at most 256 colours, when that is smaller (a plot has few
    colours and their anti-aliased edges: it looks the same at a third of the bytes)."""
    from PIL import Image

    raw = base64.b64decode(b64)
    image = Image.open(io.BytesIO(raw))
    if image.mode == "P":  # stored before: already a palette
        return b64
    if image.mode == "RGBA" and image.getextrema()[3][0] < 255:
        image = image.quantize(256, method=Image.Quantize.FASTOCTREE)  # keeps transparency
    else:
        image = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    if out.tell() >= len(raw):
        return b64
    return base64.b64encode(out.getvalue()).decode("ascii")


def _clean_output(out, host: re.Pattern | None, shrink_images: bool):
    """One output as stored, or ``None`` for an empty rank area (it shows nothing)."""
    if out.output_type == "stream":
        out.text = _redact(out.text, host)
        return out
    if out.output_type == "error":
        out.evalue = _redact(out.evalue, host)
        out.traceback = [_redact(line, host) for line in out.traceback]
        return out
    data = out.data
    if WIDGET_MIME in data:
        out.data, out.metadata = {"text/plain": WIDGET_NOTE}, {}
        return out
    if set(data) == {"text/plain"} and not data["text/plain"]:
        return None
    for mime in ("text/plain", "text/html"):
        if mime in data:
            data[mime] = _redact(data[mime], host)
    if shrink_images and "image/png" in data:
        data["image/png"] = _smaller_png(data["image/png"])
    return out


def for_storage(nb, shrink_images: bool = True, host: str | None = None):
    """A copy of the executed ``nb`` as it is committed.

    No execution timestamps or kernel versions in the metadata, no widget state
    (a widget becomes :data:`WIDGET_NOTE`), no empty rank areas, streams merged
    where they follow each other and shown as a terminal would (``\\r``), this
    machine's name (``host``, default: this one) as :data:`HOST_NAME`, pictures
    in a 256-colour palette (``shrink_images``).
    """
    nb = copy.deepcopy(nb)
    hostp = _host_pattern(socket.gethostname() if host is None else host)
    language = nb.metadata.get("language_info", {}).get("name", "python")
    nb.metadata = {"kernelspec": nb.metadata.get("kernelspec", {}), "language_info": {}}
    nb.metadata["language_info"]["name"] = language
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        outputs: list = []
        for out in cell.outputs:
            out = _clean_output(out, hostp, shrink_images)
            if out is None:
                continue
            last = outputs[-1] if outputs else None
            if out.output_type == "stream" and last and last.get("name") == out.name:
                last.text += out.text
                continue
            outputs.append(out)
        for out in outputs:
            if out.output_type == "stream":
                out.text = _terminal(out.text)
        cell.outputs = outputs
    return nb


def normalize(text: str) -> str:
    """``text`` with what changes from run to run replaced (see the module docstring)."""
    text = _FOLDERS.sub("…/", _HEX.sub("0x#", _ANSI.sub("", text)))
    return _SPACE.sub(" ", _NUMBER.sub("#", text)).strip()


def _lines(text: str) -> list[str]:
    return [n for n in (normalize(line) for line in text.splitlines()) if n]


def summary(cell) -> list[str]:
    """What is compared of a code cell's outputs, one string per line."""
    items: list = []
    ranks: set[str] | None = None  # the lines the ranks printed, in their areas
    streams: dict[str, str] = {}

    def flush_streams() -> None:
        for name in sorted(streams, key=("stdout", "stderr").index):
            lines = sorted(n for n in _lines(streams[name]) if not POLLED.fullmatch(n))
            items.extend(f"{name}: {line}" for line in lines)
        streams.clear()

    for out in cell.outputs:
        if out.output_type == "stream":
            streams[out.name] = streams.get(out.name, "") + out.text
            continue
        flush_streams()
        if out.output_type == "error":
            items.append(f"error {out.ename}: {' / '.join(_lines(out.evalue))}")
        elif "ck-rank" in out.data.get("text/html", ""):
            if ranks is None:
                ranks = set()
                items.append(ranks)
            lines = _lines(out.data.get("text/plain", ""))
            ranks.update(line for line in lines if not _RANK_HEADER.fullmatch(line))
        else:
            kinds = "+".join(sorted(out.data))
            text = " / ".join(_lines(out.data.get("text/plain", "")))
            items.append(f"{out.output_type} [{kinds}]: {text}")
    flush_streams()
    flat: list[str] = []
    for item in items:
        if isinstance(item, set):
            flat.extend(f"rank output: {line}" for line in sorted(item))
        else:
            flat.append(item)
    return flat


def unexecuted(nb) -> list[int]:
    """Numbers (1-based) of the code cells stored without having run."""
    return [i for i, c in enumerate(code_cells(nb), 1) if c.execution_count is None]


def differences(stored, fresh) -> str:
    """Where ``fresh`` (an executed notebook) differs from ``stored``; ``""`` if nowhere.

    One block per differing code cell, naming it by number and first line (two for a
    ``%%`` cell), with a diff of the compared lines (``-`` stored, ``+`` fresh run).
    """
    fresh = for_storage(fresh, shrink_images=False)
    if unexecuted(stored):
        return f"stored without outputs (code cells {unexecuted(stored)} never ran)"
    blocks = []
    pairs = zip(code_cells(stored), code_cells(fresh))
    for number, (old, new) in enumerate(pairs, 1):
        a, b = summary(old), summary(new)
        if a == b:
            continue
        lines = old.source.strip().splitlines() or [""]
        first = " | ".join(lines[:2]) if lines[0].startswith("%%") else lines[0]
        diff = list(difflib.unified_diff(a, b, lineterm="", n=1))[2:]
        blocks.append(f"code cell {number} ({first}):\n" + "\n".join(f"  {d}" for d in diff))
    return "\n".join(blocks)
