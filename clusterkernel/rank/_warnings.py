"""Warnings raised in a cell name the cell, as IPython names it (engine side).

An engine runs each cell from a file of ipykernel's (``/tmp/ipykernel_<pid>/<hash>.py``),
so a warning raised by a cell's line reads ``/tmp/ipykernel_2211/3950.py:19:
UserWarning: ...``: a path that differs on every rank and means nothing to the user.
:func:`install` makes ``warnings`` write ``Cell In[7], line 19: UserWarning: ...``
instead (the client puts the notebook's own cell number in, as for tracebacks);
warnings from files keep their path.

Example::

    install(get_ipython())
"""

from __future__ import annotations

import warnings

_original = warnings.formatwarning


def _cell_name(shell, filename: str) -> str | None:
    try:
        named = shell.compile.format_code_name(filename)
    except Exception:  # an IPython without it: the path stays
        return None
    return f"{named[0]} {named[1]}" if named else None


def install(shell) -> None:
    """Name cells in this engine's warnings (once; a second call does nothing)."""
    if getattr(warnings.formatwarning, "_clusterkernel", False):
        return

    def formatwarning(message, category, filename, lineno, line=None):
        cell = _cell_name(shell, filename)
        if cell is None:
            return _original(message, category, filename, lineno, line)
        if line is None:
            import linecache

            line = linecache.getline(filename, lineno)
        text = f"{cell}, line {lineno}: {category.__name__}: {message}\n"
        return text + (f"  {line.strip()}\n" if line and line.strip() else "")

    formatwarning._clusterkernel = True
    warnings.formatwarning = formatwarning
