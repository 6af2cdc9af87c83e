"""Pure parts of torch.distributed support: node layout, flight entries, export, hints."""

from __future__ import annotations

import pytest

from clusterkernel import Cluster
from clusterkernel.client.cluster import _torch
from clusterkernel.client.cluster._hangreport import compare
from clusterkernel.client.export import export_cells, torch_use
from clusterkernel.torchdist._env import master_address, node_layout
from clusterkernel.torchdist._flight import entries
from clusterkernel.torchdist._group import pick_backend


def test_node_layout_numbers_nodes_and_local_ranks_as_torchrun():
    layout = node_layout(["a", "a", "b", "b", "b"])
    assert [x["LOCAL_RANK"] for x in layout] == [0, 1, 0, 1, 2]
    assert [x["LOCAL_WORLD_SIZE"] for x in layout] == [2, 2, 3, 3, 3]
    assert [x["GROUP_RANK"] for x in layout] == [0, 0, 1, 1, 1]
    assert {x["GROUP_WORLD_SIZE"] for x in layout} == {2}
    # ranks placed round robin: nodes in order of their first rank
    assert [x["GROUP_RANK"] for x in node_layout(["b", "a", "b", "a"])] == [0, 1, 0, 1]
    assert [x["LOCAL_RANK"] for x in node_layout(["b", "a", "b", "a"])] == [0, 0, 1, 1]


def test_one_host_meets_on_loopback():
    assert master_address(["h", "h", "h"]) == "127.0.0.1"


def test_unresolvable_nodes_meet_on_the_network_they_share():
    hosts = ["no-such-node-a.invalid", "no-such-node-a.invalid", "no-such-node-b.invalid"]
    networks = [
        ["192.168.5.7/24", "10.231.4.1/24"],
        ["192.168.5.7/24", "10.231.4.1/24"],
        ["10.231.4.2/24"],
    ]
    assert master_address(hosts, networks) == "10.231.4.1"


def _dump(entries_, completed=1):
    return {
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_completed_collective": completed}},
        "entries": entries_,
    }


def _entry(seq, retired, size=1000, dtype="Float", op="gloo:all_reduce"):
    return {
        "record_id": seq - 1,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": op,
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "state": "scheduled",
        "retired": retired,
        "is_p2p": False,
        "time_created_ns": 0,
    }


def test_flight_entries_say_who_waits_where():
    rank0 = entries(
        True, _dump([_entry(1, True), _entry(2, False)]), where=("/tmp/ipykernel_1/2.py", 4)
    )
    rank1 = entries(False, _dump([_entry(1, True), _entry(2, False)], completed=2))
    assert rank0[-1]["done"] is False and rank0[-1]["nbytes"] == 4000
    assert rank0[-1]["dtype"] == "float32" and rank0[-1]["group_ranks"] == [0, 1]
    assert all(e["done"] for e in rank1)  # not in a torch call: nothing pending
    # rank 1 skipped #2: it never made it
    report = compare(
        {0: rank0, 1: rank1[:1]}, {0: "it is at cell line 4", 1: "it has finished the cell"}
    )
    assert (
        "rank 0 waits in all_reduce #2 (gloo" in report
        and "3.91 KiB float32, cell line 4" in report
    )
    assert "rank 1's last collective in gloo was #1 (all_reduce), and it has finished" in report


def test_a_group_made_again_keeps_only_its_newest_calls():
    calls = [_entry(1, True), _entry(2, True), _entry(1, True), _entry(2, False)]
    for i, c in enumerate(calls):
        c["record_id"] = i
    got = entries(True, _dump(calls, completed=1))
    assert [e["seq"] for e in got] == [1, 2] and got[-1]["done"] is False


def test_mismatched_sizes_are_named():
    a = entries(True, _dump([_entry(1, False, size=10)], completed=0))
    b = entries(True, _dump([_entry(1, False, size=20)], completed=0))
    report = compare({0: a, 1: b})
    assert "mismatch at gloo #1" in report and "40 B" in report and "80 B" in report


def test_export_carries_torchruns_environment_and_a_group_only_where_asked():
    # every job's ranks get torchrun's environment, as every notebook rank does
    plain = export_cells(["%%mpi\nprint(1)"])
    assert "prepare_rank()" in plain and "_torchdist.init(" not in plain
    used = export_cells(["%%mpi\nimport torch.distributed as dist\ndist.init_process_group()"])
    assert "prepare_rank()" in used and "_torchdist.init(" not in used
    made = export_cells(["%mpi start -n 2 --backend gloo", "%%mpi\nprint(2)"])
    assert "_torchdist.init('gloo')" in made
    assert torch_use(["%mpi start -n 4 --torch"]) == (True, True, None)
    # the live cluster's word wins over the cells'
    live = export_cells(["%%mpi\nprint(3)"], torch=(True, "gloo"))
    assert "_torchdist.init('gloo')" in live


def test_bad_backend_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="use gloo or nccl"):
        Cluster(n=2, backend="mpi")


def test_a_second_init_gets_a_note_that_says_what_to_do():
    twice = "ValueError: trying to initialize the default process group twice!"
    assert "%mpi start --torch made it" in _torch.error_hint([twice], True)
    assert "torch-reinit" in _torch.error_hint([twice], False)
    assert _torch.error_hint(["ZeroDivisionError: division by zero"], True) == ""


def test_each_rank_gets_its_gpus_by_local_rank():
    from clusterkernel.torchdist._gpu import GpuBindingError, devices_for

    assert [devices_for(r, 4, 4) for r in range(4)] == [[0], [1], [2], [3]]
    assert [devices_for(r, 2, 8, gpus_per_rank=4) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(GpuBindingError, match="need 4 GPUs and this host has 2.*at most 2 ranks"):
        devices_for(0, 4, 2)
    assert [devices_for(r, 4, 2, share=True) for r in range(4)] == [[0], [1], [0], [1]]
    with pytest.raises(GpuBindingError, match="no GPU"):
        devices_for(0, 1, 0)


def test_slurm_gpu_requests_reach_the_batch_file(tmp_path):
    from clusterkernel.client.export import ExportError, sbatch_script

    text = sbatch_script(tmp_path / "job.py", nodes=2, ntasks_per_node=4, gpus_per_node=4)
    assert "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --gres=gpu:a100:2" in sbatch_script(tmp_path / "job.py", gres="gpu:a100:2")
    with pytest.raises(ExportError, match="gres"):
        sbatch_script(tmp_path / "job.py", gres="gpu; rm -rf /")


def test_gpu_options_that_contradict_or_lack_slurm_are_usage_errors():
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    import clusterkernel.client.magics as ck_magics

    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    for line, said in (
        ("start -n 2 --gpus-per-node 4", "go with --slurm"),
        ("start -n 2 --no-gpu-binding --gpus-per-rank 1", "contradict"),
    ):
        with pytest.raises(UsageError, match=said):
            ck_magics._magics.mpi(line)
    with pytest.raises(ValueError, match="gpus_per_rank"):
        Cluster(n=2, gpus_per_rank=-1)


def test_a_group_made_again_is_read_without_torchs_status_of_the_old_one():
    # after reinit torch keeps the entries' group name ("0") but reports the new group's
    # status under another key: the old status must not mark the new blocked call done
    calls = [_entry(1, True), _entry(2, False)]
    data = _dump(calls, completed=125)
    data["pg_status"] = {
        "0": {"last_completed_collective": 125},
        "1": {"last_completed_collective": 1},
    }
    got = entries(True, data, where=("/tmp/ipykernel_1/3.py", 3))
    assert [e["done"] for e in got] == [True, False] and got[-1]["line"] == 3


def test_rooted_calls_torch_records_by_role_are_no_mismatch():
    root = entries(False, _dump([_entry(1, True, size=256, op="gloo:scatter")]))
    other = entries(False, _dump([_entry(1, True, size=0, op="gloo:scatter")]))
    root[0]["done"] = other[0]["done"] = False  # both waiting in it
    assert "mismatch" not in compare({0: root, 1: other})


def test_ranks_that_share_gpus_get_gloo_and_ranks_with_their_own_get_torchs_pick():
    assert pick_backend(None, gpus=4, local_ranks=4) is None  # torch's: NCCL for CUDA
    assert pick_backend(None, gpus=1, local_ranks=2) == "gloo"  # NCCL refuses a shared GPU
    assert pick_backend(None, gpus=0, local_ranks=1) == "gloo"
    assert pick_backend("nccl", gpus=8, local_ranks=2) == "nccl"  # asked: as asked
