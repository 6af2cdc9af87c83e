"""A rank's frame locals as short text, for stack reports and the debugger (engine side).

Shared by ``_engine_setup`` (stacks with locals) and ``_debugger`` (pdb's
locals view), so that neither imports the other.
"""

from __future__ import annotations

import reprlib
import types

_repr = reprlib.Repr()
_repr.maxstring = 120
_repr.maxother = 120
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 8


def _safe_repr(value) -> str:
    try:
        return _repr.repr(value)
    except Exception as e:  # a broken __repr__ must not break the report
        return f"<unprintable {type(value).__name__}: {e}>"


def frame_locals(frame: types.FrameType) -> dict[str, str]:
    """A frame's locals as short reprs; a cell's (the rank's globals) without
    modules, functions, classes and IPython's own names.

    Example::

        import sys
        frame_locals(sys._getframe())   # {"x": "10", "name": "'rank 1'"}
    """
    names = dict(frame.f_locals)
    if frame.f_code.co_name == "<module>":
        names = {k: v for k, v in names.items() if not k.startswith("_")}
        names = {k: v for k, v in names.items() if k not in ("In", "Out", "exit", "quit")}
        names = {k: v for k, v in names.items() if not _is_module_or_function(v)}
    return {k: _safe_repr(v) for k, v in names.items()}


def _is_module_or_function(value) -> bool:
    kinds = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
    return isinstance(value, kinds) or isinstance(value, type)
