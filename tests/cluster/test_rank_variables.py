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


def test_cpu_tensors_go_out_of_band_and_come_back_over_the_buffers_given():
    """What a respawn's copy does (``rank._respawn.copy_namespace``): with a buffer list,
    every CPU tensor's bytes go into it instead of the pickle, and the loaded tensors are
    made over the buffers handed back (no copy; a uint8 tensor handed back lends its own
    storage, resizable); an optimizer still holds the loaded model's parameters. Without
    the list the pickle holds the bytes, as before."""
    import pickle

    import torch

    from clusterkernel.rank._variables import pickled

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 256)).sum().backward()
    opt.step()
    half = torch.arange(6.0).to(torch.bfloat16)
    ns = {"model": model, "opt": opt, "half": half, "view": half[2:4], "none": torch.empty(0)}

    buffers: list = []
    blob, names, skipped = pickled(ns, buffers)
    sizes = [b.raw().nbytes for b in buffers]
    assert (names, skipped) == (["half", "model", "none", "opt", "view"], {})
    # weight, bias, their two momentum buffers, half and its view (storage each), empty
    assert sorted(sizes) == sorted([256 * 256 * 4, 256 * 4] * 2 + [12, 12, 0])
    assert len(blob) < 20_000  # no tensor's bytes in the pickle itself
    given = [bytearray(b.raw()) for b in buffers]
    values, _ = pickle.loads(blob, buffers=given)

    new, new_opt = values["model"], values["opt"]
    assert torch.equal(new.weight, model.weight) and torch.equal(new.bias, model.bias)
    assert new_opt.param_groups[0]["params"] == list(new.parameters())
    assert torch.equal(
        new_opt.state[new.weight]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"]
    )
    assert values["half"].dtype == torch.bfloat16 and torch.equal(values["view"], half[2:4])
    first = sizes.index(256 * 256 * 4)  # the weight's: the model is pickled first
    assert float(new.weight.detach()[0, 0]) != 0.0
    given[first][:4] = bytes(4)  # the buffer handed back is the new tensor's memory
    assert float(new.weight.detach()[0, 0]) == 0.0 and float(model.weight.detach()[0, 0]) != 0.0

    # what copy_namespace receives into: new uint8 tensors, whose storage is kept
    own = [
        torch.frombuffer(bytearray(b.raw()), dtype=torch.uint8).clone()
        if b.raw().nbytes
        else torch.empty(0, dtype=torch.uint8)
        for b in buffers
    ]
    again, _ = pickle.loads(blob, buffers=own)
    assert torch.equal(again["model"].weight, model.weight)
    assert again["model"].weight.untyped_storage().data_ptr() == own[first].data_ptr()
    again["model"].weight.data.resize_(256 * 256 + 1)  # in place: its storage grows

    alone, _, _ = pickled(ns)
    assert len(alone) > 2 * 256 * 256 * 4
    assert torch.equal(pickle.loads(alone)[0]["model"].weight, model.weight)
