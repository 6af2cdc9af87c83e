"""One sbatch writer (issue 28 item 2): ``%mpi start --slurm`` and export write the same
``#SBATCH`` lines from the same options, with one default time limit and one validation.

No Slurm needed: the launcher's job script is made, not submitted.
"""

from __future__ import annotations

import argparse
import inspect

import pytest
from IPython.core.magic_arguments import parse_argstring

from clusterkernel import Cluster
from clusterkernel.client.cluster import LaunchSettings
from clusterkernel.client.export import ExportError, add_arguments, sbatch_script
from clusterkernel.client.launch import BatchLauncher
from clusterkernel.client.magics._args import export_args, start_args
from clusterkernel.client.scheduler import get as scheduler
from clusterkernel.client.scheduler._slurm import DEFAULT_TIME, SbatchOptions

# what each writer adds of its own: the job's name and output file (the launcher's are
# ipyparallel's template fields, with --ntasks and --export=ALL)
_OWN = tuple(f"#SBATCH --{o}=" for o in ("job-name", "output", "ntasks", "export"))


def _header(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def _shared(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(_OWN)]


def _slurm(n: int, **options) -> BatchLauncher:
    return LaunchSettings(n, launcher="slurm", **options).build()


@pytest.fixture(autouse=True)
def _outside_an_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"nodes": 2, "time": "0-02:30:00", "partition": "gpu", "account": "proj-1"},
        {"nodes": 2, "time": "UNLIMITED", "gpus_per_node": 4, "gres": "gpu:a100:2"},
    ],
)
def test_slurm_start_and_export_write_the_same_header(tmp_path, options):
    options = dict(options)
    nodes = options.get("nodes", 1)
    exported = _header(sbatch_script(tmp_path / "job.py", ntasks_per_node=3, **options))
    # the magic hands the GPU request to the launcher as extra sbatch options
    gpus = {k: options.pop(k) for k in ("gpus_per_node", "gres") if k in options}
    extra = SbatchOptions(time=None, **gpus).directives()
    launcher = _slurm(3 * nodes, slurm_args=extra, **options)
    launched = _header(launcher.batch_script())
    assert launched[:4] == [
        "#SBATCH --job-name=clusterkernel-{cluster_id}",
        f"#SBATCH --ntasks={3 * nodes}",
        "#SBATCH --output={output_file}",
        "#SBATCH --export=ALL",
    ]
    assert exported[0] == "#SBATCH --job-name=job"
    assert exported[-1] == f"#SBATCH --output={tmp_path}/job-%j.out"
    expected = SbatchOptions(**{"nodes": 1, **options, **gpus, "ntasks_per_node": 3}).lines()
    assert _shared(exported) == expected
    if "nodes" not in options:  # the launcher leaves the spread to Slurm
        expected = [
            line for line in expected if "--nodes" not in line and "-per-node=3" not in line
        ]
    assert _shared(launched) == expected


def test_one_default_time_limit_everywhere():
    assert DEFAULT_TIME == "01:00:00"
    defaults = {
        "SbatchOptions": SbatchOptions().time,
        "sbatch_script": inspect.signature(sbatch_script).parameters["time"].default,
        "the launcher": _slurm(4).system.sbatch.time,
        "LaunchSettings": LaunchSettings().time,
        "Slurm": next(o.default for o in scheduler("slurm").options if o.name == "time"),
        "Grid Engine": next(o.default for o in scheduler("sge").options if o.name == "time"),
        "%mpi start": parse_argstring(start_args, "--slurm").time,
        "%mpi export": parse_argstring(export_args, "job.py").time,
    }
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults["clusterkernel export"] = parser.parse_args(["nb.ipynb"]).time
    assert set(defaults.values()) == {DEFAULT_TIME}, defaults
    assert "--time=01:00:00" in _slurm(4).batch_script()
    assert f"(default {DEFAULT_TIME})" in start_args.__doc__
    assert f"(default {DEFAULT_TIME})" in export_args.__doc__
    help_text = parser.format_help()
    assert f"(default {DEFAULT_TIME})" in help_text


@pytest.mark.parametrize(
    "options, message",
    [
        ({"time": "two hours"}, "--time 'two hours': use minutes, HH:MM:SS"),
        ({"time": "1:00:00\n#SBATCH --exclusive"}, "--time '1:00:00\\\\n#SBATCH"),
        ({"nodes": 0}, "--nodes must be a positive integer; got 0"),
        ({"nodes": -2}, "--nodes must be a positive integer; got -2"),
        ({"partition": "gpu; rm -rf /"}, "--partition 'gpu; rm -rf /': use letters"),
        ({"partition": "gpu\n#SBATCH --exclusive"}, "--partition"),
        ({"account": "proj 1"}, "--account 'proj 1': use letters"),
    ],
)
def test_bad_options_are_refused_alike(options, message):
    with pytest.raises(ExportError, match=message) as exported:
        sbatch_script("job.py", **options)
    with pytest.raises(ValueError, match=message) as launched:
        _slurm(4, **options)
    with pytest.raises(ValueError, match=message) as cluster:
        Cluster(n=4, launcher="slurm", **options)  # before anything starts
    assert str(exported.value) == str(launched.value) == str(cluster.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpus_per_node": 0}, "--gpus-per-node must be a positive integer; got 0"),
        ({"gres": "gpu; rm -rf /"}, "--gres 'gpu; rm -rf /': use Slurm's form"),
    ],
)
def test_bad_gpu_requests_are_refused_alike(options, message):
    with pytest.raises(ExportError, match=message) as exported:
        sbatch_script("job.py", **options)
    with pytest.raises(ValueError, match=message) as started:
        SbatchOptions(time=None, **options)  # what %mpi start --slurm checks them with
    assert str(exported.value) == str(started.value)


def test_extra_options_are_one_line_each_and_escaped_for_the_template():
    with pytest.raises(ValueError, match=r"slurm_args=\): give each option as a string on one"):
        _slurm(4, slurm_args=["--constraint=a100\n#SBATCH --exclusive"])
    script = _slurm(4, slurm_args=["--comment={x}"]).batch_script()
    assert "#SBATCH --comment={{x}}" in script  # ipyparallel's str.format gives {x} back
    assert script.format(cluster_id="c", n=4, output_file="o", program_and_args="p")


@pytest.mark.parametrize(
    "line, options",
    [
        ("--time 2h", {"time": "2h"}),
        ("--nodes 0", {"nodes": 0}),
        ("--gres gpu;x", {"gres": "gpu;x"}),
        ("--gpus-per-node 0", {"gpus_per_node": 0}),
    ],
)
def test_mpi_start_slurm_refuses_them_with_the_same_message(line, options):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    import clusterkernel.client.magics as ck_magics

    InteractiveShell.instance().run_line_magic("load_ext", "clusterkernel")
    with pytest.raises(ExportError) as exported:
        sbatch_script("job.py", **options)
    with pytest.raises(UsageError) as refused:  # %mpi export goes through sbatch_script
        ck_magics._magics.mpi(f"start -n 2 --slurm {line}")  # before anything starts
    assert str(refused.value) == str(exported.value)


def test_both_export_parsers_name_the_sbatch_options_alike():
    from clusterkernel.client.export import sbatch_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    line = "--nodes 2 --time 2:00:00 --partition gpu --account a --gpus-per-node 4 --gres gpu:4"
    from_magic = sbatch_args(parse_argstring(export_args, f"job.py {line}"))
    from_cli = sbatch_args(parser.parse_args(["nb.ipynb", *line.split()]))
    assert from_magic == from_cli
    assert from_magic["nodes"] == 2 and from_magic["gres"] == "gpu:4"
    assert sbatch_args(parse_argstring(export_args, "job.py")) == sbatch_args(
        parser.parse_args(["nb.ipynb"])
    )
