"""The shape of a metric record: the one thing both sides of the seam know.

Engine side (``clusterkernel.metrics``) produces records; client side
(``clusterkernel.client.dashboard``) consumes them. A record is a plain ``dict`` so it
crosses ipyparallel's channels and JSON export unchanged. No imports beyond the
standard library, so either side can load this module alone.

Kinds:

``comm``  one communication call::

    {"kind": "comm", "rank": 0, "op": "all_reduce", "nbytes": 4096,
     "algorithm": "mpi", "group_size": 4, "start": 12.5, "duration": 1.2e-5,
     "wait": 0.0}

  ``start`` is ``time.perf_counter()`` on that rank; ``duration`` is seconds in
  the call (for async calls, issue to completion); ``wait`` is seconds spent
  blocked in ``wait()`` (NaN where not measured: the blocked part of torch's
  DDP bucket all-reduces, which overlap the backward pass).

``scalar`` values logged at one step (loss, throughput, staleness, ...)::

    {"kind": "scalar", "rank": 1, "step": 10, "time": 13.0,
     "values": {"loss": 0.41}}

``span`` a named interval of compute on a rank (for the timeline)::

    {"kind": "span", "rank": 0, "name": "backward", "start": 12.0, "duration": 0.02}
"""

from __future__ import annotations

# The comm record's layout, declared once: its fields in order, each with its type
# ("str": a name, "int", "float"). The metrics recorder's ring (metrics/_ring.py), the
# stream's columns (protocol/_wire.py) and the C fast path's writes (comm/_fast.c,
# handed the ring's offsets from it) all take it from here.
COMM_LAYOUT = (
    ("op", "str"),
    ("nbytes", "int"),
    ("algorithm", "str"),
    ("group_size", "int"),
    ("start", "float"),
    ("duration", "float"),
    ("wait", "float"),
)
COMM_FIELDS = tuple(name for name, _ in COMM_LAYOUT)
KINDS = ("comm", "scalar", "span")
# The ipyparallel label of each cell the notebook sends (``Cluster.run``), the same on
# every rank: the ranks mark their records with it, so each execution of a cell is one
# run in the dashboard (``Recorder.mark_cell``)
CELL_LABEL = "ck-cell "
# What a cell the notebook gave no number is called (``cluster.run`` from a script), as
# its tracebacks call it; a numbered one is ``Cell In[7]``, as IPython writes it
UNNUMBERED_CELL = "%%mpi cell"


def cell_label(token: str, count: int | None) -> str:
    """The label of one run of a cell: :data:`CELL_LABEL`, ``token`` (unique per run)
    and, when known, the notebook's ``In [count]`` (the ranks name the cell's code after
    it in profiles, as IPython does: ``Cell In[7]``).

    Example::

        cell_label("3f2a", 7)   # "ck-cell 3f2a In[7]"
    """
    return f"{CELL_LABEL}{token}" + ("" if count is None else f" In[{count}]")


def label_count(label: object) -> int | None:
    """The notebook's cell number in a :func:`cell_label`, or None (none given, not ours).

    Example::

        label_count("ck-cell 3f2a In[7]")   # 7
    """
    if not isinstance(label, str) or not label.startswith(CELL_LABEL) or "In[" not in label:
        return None
    number = label.rsplit("In[", 1)[1].rstrip("]")
    return int(number) if number.isdigit() else None


def comm_record(rank: int, fields: tuple) -> dict:
    """Build a ``comm`` record from a tuple in :data:`COMM_FIELDS` order."""
    rec = dict(zip(COMM_FIELDS, fields))
    rec["kind"] = "comm"
    rec["rank"] = rank
    return rec


def scalar_record(rank: int, step: int, time: float, values: dict) -> dict:
    return {"kind": "scalar", "rank": rank, "step": step, "time": time, "values": dict(values)}


def span_record(rank: int, name: str, start: float, duration: float) -> dict:
    return {"kind": "span", "rank": rank, "name": name, "start": start, "duration": duration}


def human_bytes(nbytes: int) -> str:
    """``40 B``, ``3.91 KiB``, ``4 MiB``: a size as reports show it (both sides use it)."""
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1 << 20:
        return f"{nbytes / 1024:.3g} KiB"
    return f"{nbytes / (1 << 20):.3g} MiB"
