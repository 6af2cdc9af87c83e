"""A rank's variables pickled and put back into its live namespace (no ranks needed).

Run in a real IPython shell in a process of its own, as on an engine: functions defined
in cells come back from the pickle with the shell's namespace as their globals (cell
classes' methods, closures, partials, lambdas in containers too), a live variable is not
replaced by a function's copy of it, and IPython's ``__builtins__`` stays the module.
The same on real ranks after a restore and a respawn: tests/cluster/test_respawn.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    '''
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    def cell(code):
        result = shell.run_cell(code)
        result.raise_error()

    cell("""
    import functools, pickle
    from clusterkernel.rank._variables import pickled, put_back, user_namespace
    n = 1
    def bump(k=1):
        global n
        n += k
    class Counter:
        def up(self):
            bump(10)
    def outer(k):
        def inner():
            bump(k)
        return inner
    held = {"fs": [outer(100), functools.partial(bump, 1000), lambda: bump(10000)]}
    counter = Counter()
    blob = pickled({k: v for k, v in globals().items() if k in ("n", "bump", "Counter", "held", "counter")})[0]
    del n, bump, Counter, held, counter
    """)
    cell("""
    print(put_back(*pickle.loads(blob)))
    bump(); counter.up(); [f() for f in held["fs"]]
    fs = [bump, Counter.up, type(counter).up, held["fs"][0], held["fs"][1].func, held["fs"][2]]
    print(n, [f.__globals__ is globals() for f in fs], held["fs"][1].func is bump)
    print(type(__builtins__).__name__)
    n = 5
    put_back(*pickle.loads(blob), {"bump"})   # bump alone: the live n stays
    bump()
    print(n)
    """)
    '''
)


def test_cell_functions_come_back_bound_to_the_live_namespace():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['Counter', 'bump', 'counter', 'held', 'n']",
        "11112 [True, True, True, True, True, True] True",
        "module",
        "6",
    ], done.stdout
