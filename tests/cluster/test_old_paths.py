"""Users' imports of the paths before the client/ folder keep working for a release, with a
DeprecationWarning that points at their own import line and names the new path."""

from __future__ import annotations

import json
import subprocess
import sys

# old path -> (new path, names users imported from it)
OLD_PATHS = {
    "clusterkernel.magics": ("clusterkernel.client.magics", ["current_cluster", "MPIMagics"]),
    "clusterkernel.mpiexec": ("clusterkernel.client.mpiexec", ["MPIRuntime", "HostError"]),
    "clusterkernel.export": ("clusterkernel.client.export", ["export_cells", "write_job"]),
    "clusterkernel.dashboard": ("clusterkernel.client.dashboard", ["Dashboard", "MetricsStore"]),
    "clusterkernel.cluster": ("clusterkernel.client.cluster", ["Cluster", "LaunchSettings"]),
}

# run in a fresh process: a module warns once, when it is first imported
_CODE = """
import importlib, json, warnings
old, new, names = {args!r}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"from {{old}} import {{', '.join(names)}}")
new_module = importlib.import_module(new)
same = all(eval(n) is getattr(new_module, n) for n in names)
print(json.dumps([same, [(w.category.__name__, str(w.message), w.filename) for w in caught]]))
"""


def _import(old: str, new: str, names: list[str]) -> tuple[bool, list]:
    code = _CODE.format(args=(old, new, names))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_old_module_paths_forward_with_a_warning_naming_the_new_path():
    for old, (new, names) in OLD_PATHS.items():
        same, caught = _import(old, new, names)
        assert same, f"{old} gives other objects than {new}"
        ours = [(cat, msg, where) for cat, msg, where in caught if old in msg]
        assert len(ours) == 1, (old, caught)
        category, message, where = ours[0]
        assert category == "DeprecationWarning" and f"import {new} instead" in message
        # the user's own line (here the exec'd import), which Python shows by default in
        # a notebook's cell; not importlib's frames nor the forwarding module itself
        assert where == "<string>", (old, where)


def test_current_cluster_is_public_and_none_before_a_start():
    # a fresh process: no magic has made a cluster there
    code = "import clusterkernel; print(clusterkernel.current_cluster())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr
    import clusterkernel

    assert "current_cluster" in clusterkernel.__all__ and clusterkernel.current_cluster.__doc__
