"""Grid Engine's options, declared once by its class (issue 37 item 1): ``Cluster(...,
launcher="sge", queue=...)``, ``%mpi start --scheduler sge --queue ...`` and ``%mpi
export --qsub`` take them from there and refuse a bad one alike. Nothing is submitted.
"""

from __future__ import annotations

import pytest
from IPython.core.magic_arguments import parse_argstring

from clusterkernel import Cluster
from clusterkernel.client.cluster import LaunchSettings
from clusterkernel.client.export import ExportError, job_script
from clusterkernel.client.magics._args import start_args


def test_the_magic_and_the_api_make_the_same_grid_engine_job():
    line = "-n 4 --scheduler sge --queue all.q --time 0:30:00"
    from_magic = LaunchSettings.from_args(parse_argstring(start_args, line))
    launcher = Cluster(n=4, launcher="sge", queue="all.q", time="0:30:00").launcher
    assert from_magic == launcher.settings and launcher.describe() == "sge"
    script = launcher.batch_script()
    for line in ("#$ -pe mpi 4", "#$ -q all.q", "#$ -l h_rt=0:30:00", "#$ -o {output_file}"):
        assert line in script.splitlines(), script
    assert " -n 4 {program_and_args} &" in script and "mpiexec" in script
    # qdel's warning ends mpiexec, which ends the ranks (qdel's SIGKILL would miss them)
    assert "#$ -notify" in script.splitlines(), script
    assert "trap 'kill -TERM $ranks 2>/dev/null' USR2" in script.splitlines(), script
    exported = job_script("sge", "job.py", 4, queue="all.q", time="0:30:00")
    assert [ln for ln in exported.splitlines() if ln.startswith(("#$ -pe", "#$ -q", "#$ -l"))] == [
        "#$ -pe mpi 4",
        "#$ -l h_rt=0:30:00",
        "#$ -q all.q",
    ]


def test_bad_or_stray_grid_engine_options_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="--queue 'all q'") as started:
        Cluster(n=4, launcher="sge", queue="all q")
    with pytest.raises(ExportError, match="--queue 'all q'") as exported:
        job_script("sge", "job.py", 4, queue="all q")
    assert str(started.value) == str(exported.value)
    with pytest.raises(ValueError, match="--queue: they go with --scheduler sge"):
        LaunchSettings.from_args(parse_argstring(start_args, "-n 2 --queue all.q"))
    with pytest.raises(ValueError, match="are for launcher='sge'"):
        Cluster(n=2, queue="all.q")  # mpiexec refuses a scheduler's option
    with pytest.raises(ValueError, match="not an option of launcher='sge'"):
        Cluster(n=2, launcher="sge", nodes=2)  # Slurm's, not Grid Engine's
    with pytest.raises(ValueError, match="Grid Engine chooses the hosts"):
        Cluster(n=2, launcher="sge", hosts="localhost:2")
