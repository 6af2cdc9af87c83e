"""install-kernel / uninstall-kernel through the real command, into a temporary prefix."""

from __future__ import annotations

import json
import subprocess
import sys

from jupyter_client.kernelspec import KernelSpecManager


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterkernel", *args], capture_output=True, text=True
    )


def test_install_writes_the_kernelspec_and_uninstall_removes_it(tmp_path, monkeypatch):
    prefix = tmp_path / "p"
    done = _cli("install-kernel", "-n", "3", "--name", "mpi3", "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "mpi3"
    assert str(spec_dir) in done.stdout
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (MPI, 3 ranks)"
    assert spec["argv"] == [
        sys.executable, "-m", "clusterkernel.client.kernel", "-f", "{connection_file}", "--ranks", "3",
    ]  # fmt: skip
    assert spec["language"] == "python"
    assert spec["interrupt_mode"] == "signal"
    assert sorted(p.name for p in spec_dir.glob("logo-*.png")) == [
        "logo-32x32.png",
        "logo-64x64.png",
    ]

    # Jupyter finds it where JupyterLab would look
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    found = KernelSpecManager().get_kernel_spec("mpi3")
    assert found.display_name == "Python 3 (MPI, 3 ranks)"

    # found through JUPYTER_PATH without --prefix, as a user would type it
    done = _cli("uninstall-kernel", "--name", "mpi3")
    assert done.returncode == 0, done.stderr
    assert not spec_dir.exists()
    done = _cli("uninstall-kernel", "--name", "mpi3")
    assert done.returncode != 0 and "No kernelspec named 'mpi3'" in done.stderr


def test_python_m_clusterkernel_kernel_and_uninstall_with_prefix(tmp_path):
    prefix = tmp_path / "p"
    done = _cli("install-kernel", "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    spec = json.loads((prefix / "share/jupyter/kernels/clusterkernel/kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (MPI, 4 ranks)"
    assert spec["argv"][-2:] == ["--ranks", "4"]
    done = _cli("uninstall-kernel", "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    assert not (prefix / "share/jupyter/kernels/clusterkernel").exists()


def test_bad_input_says_what_to_do(tmp_path):
    done = _cli("install-kernel", "-n", "0", "--prefix", str(tmp_path))
    assert done.returncode != 0 and "at least 1" in done.stderr
    done = _cli("install-kernel", "--name", "bad name!", "--prefix", str(tmp_path))
    assert done.returncode != 0 and "letters, digits" in done.stderr
    done = _cli("uninstall-kernel", "--name", "nothere", "--prefix", str(tmp_path))
    assert done.returncode != 0 and "No kernelspec 'nothere'" in done.stderr
    assert not any(tmp_path.rglob("kernel.json"))


def test_the_command_lists_both_subcommands():
    done = _cli("--help")
    assert "install-kernel" in done.stdout and "uninstall-kernel" in done.stdout


def test_a_kernelspec_from_before_the_client_folder_still_reaches_the_kernel():
    """Older kernelspecs run ``python -m clusterkernel.kernel``: it is the same kernel
    (its argument check answers, before any kernel starts)."""
    done = subprocess.run(
        [sys.executable, "-m", "clusterkernel.kernel", "--ranks", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "--ranks must be at least 1, got 0" in done.stderr


def test_start_options_go_into_the_spec_and_a_bad_one_is_refused_at_install(tmp_path):
    """``--start-options``: the rest of ``%mpi start``'s options, read by its own parser at
    install (no login node, no scheduler asked), carried by the kernelspec's argv to the
    kernel's ``%mpi start``; a mistake is refused at install, saying what to write, and
    nothing is installed."""
    from clusterkernel.client.kernel import start_line

    prefix = tmp_path / "p"
    options = "--slurm --nodes 2 --ssh login"
    done = _cli("install-kernel", "-n", "2", "--keep", "2h", "--start-options", options,
                "--name", "slurm2", "--prefix", str(prefix))  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = json.loads((prefix / "share/jupyter/kernels/slurm2/kernel.json").read_text())
    assert spec["argv"][-5:] == ["--ranks", "2", "--keep", "2h", f"--start-options={options}"]
    assert spec["display_name"] == f"Python 3 (MPI, 2 ranks) {options}"
    assert start_line(2, keep="2h", start=options) == f"-n 2 --keep 2h {options}"

    for bad, says in (
        ("--nodse 2", "unknown option --nodse. Did you mean --nodes?"),
        ("--nodes 2", "--nodes: they go with --slurm or --scheduler slurm."),
        ("--ssh login", "ssh= starts the ranks as a scheduler's job"),
        ("--slurm --keep 2h", "give --keep TIME as install-kernel's own option"),
    ):
        done = _cli("install-kernel", "-n", "2", "--start-options", bad, "--prefix", str(prefix))
        assert done.returncode != 0, bad
        assert says in done.stderr and "Nothing was installed." in done.stderr, done.stderr
    assert [p.parent.name for p in prefix.rglob("kernel.json")] == ["slurm2"]
    assert "--start-options OPTIONS" in _cli("install-kernel", "--help").stdout
