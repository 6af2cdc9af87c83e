"""Which tests carry the ``cluster`` and ``slow`` markers (``tests/conftest.py`` applies them).

- ``cluster``: the test starts MPI ranks or an ipyparallel cluster, so it must run
  under the shared lock, one at a time. A test is marked when a fixture it uses
  (directly or through other fixtures) manages the session's cluster or starts ranks
  (:data:`CLUSTER_FIXTURES`), when its module runs jobs on ranks with one of
  :data:`RANK_RUNNERS` (``tests._mpirun.run_mpi`` and what wraps it), or when it is
  listed in :data:`STARTS_RANKS` because it starts ``mpiexec`` its own way.
- ``slow``: the test took 10 s or more on its own (each notebook, the Binder venv
  build, the browser tests, the longest kernel, fault and Slurm runs), listed in
  :data:`SLOW` with its time. ``pytest -m "not slow"`` runs the rest in a few minutes.

A listed name is a module (``.py``) or one of its tests, parameters aside. Example::

    markers_for("tests/x.py::test_a[2]", {"tmp_path", "cluster"}, set())   # {"cluster"}
"""

from __future__ import annotations

from collections.abc import Iterable

# ``_shared_holder`` is behind ``cluster`` and ``no_shared_cluster`` (and a module's own
# cluster fixture that stops the shared one); ``mpi_kernel`` reaches it too
CLUSTER_FIXTURES = frozenset({"_shared_holder", "slurm_testbed", "sge_testbed", "run_ranks"})

# a module that holds one of these names runs its tests' jobs on real ranks
RANK_RUNNERS = frozenset({"run_mpi", "run_worker", "run_case_files"})

# tests that start ranks without those
STARTS_RANKS = frozenset(
    {
        "tests/dashboard/test_stream.py::test_fast_loop_never_waits_for_a_slow_notebook_and_nothing_is_lost",
        "tests/cluster/test_session_dirs.py::test_a_launcher_given_a_killed_launchers_pid_starts",
        # runs mpiexec in a pytest of its own to check tests/_spawn_check.py
        "tests/test_markers.py::test_an_unmarked_test_that_starts_ranks_fails_naming_the_marker",
    }
)

# Tests of 10 s or more, with the seconds one took (setup, call and teardown) in a run
# of the whole suite on the 2-core machine, other work beside it (issue 15 item 7)
SLOW: dict[str, float] = {
    "tests/notebooks/test_notebooks.py::test_notebook_executes_and_gives_the_stored_outputs": 18,
    "tests/notebooks/test_notebooks.py::test_notebook_08_runs_on_two_slurm_nodes": 90,
    "tests/notebooks/test_notebooks.py::test_notebook_08_without_slurm_runs_on_this_machine": 21,
    "tests/test_binder.py::test_fresh_venv_from_binder_runs_the_quick_start": 59,
    "tests/dashboard/test_browser.py": 42,
    "tests/kernel/test_browser.py": 17,
    "tests/slurm/test_export_job.py::test_exported_notebook_as_a_batch_job_matches_the_notebook": 23,
    "tests/cluster/test_notebook_kernel.py::test_interrupt_frees_ranks_and_killed_kernel_leaves_nothing": 19,
    "tests/cluster/test_lifecycle_files.py::test_a_jupyter_servers_log_stays_clean_while_a_cluster_runs": 20,
    "tests/kernel/test_restart.py::test_interrupt_reaches_the_ranks_and_restart_replaces_them": 19,
    "tests/dashboard/test_stream.py::test_fast_loop_never_waits_for_a_slow_notebook_and_nothing_is_lost": 18,
    "tests/cluster/test_multi_host.py::test_ranks_on_two_hosts": 18,
    "tests/cluster/test_fault_tolerant.py::test_dead_rank_is_reported_and_the_others_carry_on": 17,
    "tests/dashboard/test_notebook_model.py::test_widgets_hold_exactly_what_every_rank_logged": 17,
    "tests/cluster/test_flight_report.py::test_skipped_collective_names_who_waits_and_who_is_behind": 17,
    "tests/slurm/test_slurm_cluster.py::test_stacks_and_locals_of_ranks_on_the_other_node": 14,
    "tests/train_async/test_resume.py::test_server_checkpoint_and_resume_continue_training": 13,
    "tests/slurm/test_slurm_cluster.py::test_a_rank_that_dies_on_the_other_node_is_named": 12,
    "tests/slurm/test_slurm_respawn.py::test_a_rank_killed_on_node2_is_respawned_on_node2": 17,
    "tests/slurm/test_slurm_respawn.py::test_a_train_steps_cell_survives_a_death_on_node2_by_itself": 20,
    "tests/slurm/test_ssh.py::test_ranks_on_both_nodes_from_outside_kept_through_a_killed_kernel_then_nothing_left": 27,
    "tests/slurm/test_ssh.py::test_a_rank_respawned_from_outside_then_a_killed_kernel_has_its_job_released": 15,
    "tests/slurm/test_ssh.py::test_a_network_drop_mid_cell_loses_the_connection_and_the_cell_completes": 38,
    "tests/sge/test_sge_ssh.py::test_two_ranks_under_grid_engine_from_outside_then_nothing_left": 11,
    "tests/slurm/test_ssh.py::test_the_mpi_kernel_installed_on_the_laptop_runs_its_cells_on_both_nodes": 11,
    "tests/slurm/test_ssh.py::test_the_kept_mpi_kernel_on_the_laptop_attaches_again_after_a_restart": 15,
    "tests/cluster/test_sync.py::test_what_a_host_lost_is_sent_again_and_a_restarted_rank_imports_the_copy": 12,
    "tests/cluster/test_sync_hosts.py": 10,
    "tests/dashboard/test_kernel_status.py::test_dashboard_cell_stays_busy_through_jupyterlabs_subshell_requests": 11,
    "tests/cluster/test_quickstart.py::test_quickstart_runs_in_a_terminal": 10,
    "tests/test_examples.py::test_examples_that_start_their_own_cluster": 17,
    "tests/torchdist/test_on_ranks.py::test_a_hang_with_ddp_and_fsdp_models_alive_is_freed_keeping_the_models": 20,
    "tests/cluster/test_respawn.py::test_respawn_when_nothing_died_is_a_clear_no_op": 13,
    "tests/cluster/test_multi_host.py::test_a_dead_rank_on_the_other_host_is_respawned_there": 19,
    "tests/cluster/test_respawn.py::test_data_parallel_killed_at_step_50_resumes_to_the_undisturbed_weights": 10,
    "tests/cluster/test_respawn.py::test_cell_functions_change_the_ranks_globals_after_a_restore_and_a_respawn": 11,
    "tests/cluster/test_respawn.py::test_a_rank_that_dies_in_the_copy_is_told_and_a_further_respawn_works": 19,
    "tests/cluster/test_respawn.py::test_two_ranks_a_rank_killed_mid_cell_comes_back_with_a_copy": 11,
    "tests/cluster/test_respawn.py::test_a_death_mid_cell_is_told_once_and_the_survivors_errors_folded": 12,
    "tests/cluster/test_respawn.py::test_chaos_seeded_sigkills_in_a_trainer_cell_end_at_the_undisturbed_weights": 16,
    "tests/cluster/test_respawn_fsdp.py::test_fsdp2_and_ddp_models_train_on_after_a_holder_is_respawned": 23,
    "tests/torchdist/test_on_ranks.py::test_a_rank_wedged_in_c_code_holding_the_gil_is_named_and_restarted": 14,
    "tests/torchdist/test_on_mpiexec.py::test_torchrun_cases_on_n_ranks": 11,
    "tests/torchdist/test_on_ranks.py::test_a_rank_blocked_in_gloo_is_named_and_freed_keeping_variables": 10,
    "tests/cluster/test_keep.py::test_a_killed_kernel_keeps_its_ranks_and_a_terminal_ipython_attaches": 11,
    "tests/cluster/test_keep.py::test_the_mpi_kernel_with_keep_attaches_again_after_a_restart": 10,
    "tests/slurm/test_slurm_lifecycle.py::test_a_kept_job_survives_a_killed_kernel_and_stop_after_attach_cancels_it": 13,
    "tests/sge/test_sge_cluster.py::test_a_kept_job_survives_a_killed_kernel_and_stop_after_attach_cancels_it": 11,
    "tests/cluster/test_keep.py::test_ranks_that_die_while_no_one_is_attached_are_reported_once_then_removed": 11,
    "tests/cluster/test_keep.py::test_a_short_keep_expires_and_removes_everything": 11,
    "tests/kernel/test_completion.py::test_an_ordinary_kernel_completes_in_mpi_cells_even_while_one_runs": 15,
    "tests/kernel/test_completion.py::test_the_mpi_kernel_completes_and_inspects_rank_names": 12,
    "tests/test_notebooks_command.py::test_the_quick_starts_last_command_runs_as_printed_without_an_activated_venv": 12,
}


def _names(nodeid: str) -> tuple[str, str]:
    module, _, rest = nodeid.partition("::")
    return module, f"{module}::{rest.split('[', 1)[0]}"


def markers_for(nodeid: str, fixturenames: Iterable[str], module_names: Iterable[str]) -> set[str]:
    """The markers of test ``nodeid`` (as pytest names it from the rootdir), given the
    names of the fixtures it uses (all of them: pytest's ``item.fixturenames``) and of
    its module's globals."""
    names = _names(nodeid)
    out = set()
    if (
        CLUSTER_FIXTURES.intersection(fixturenames)
        or RANK_RUNNERS.intersection(module_names)
        or any(n in STARTS_RANKS for n in names)
    ):
        out.add("cluster")
    if any(n in SLOW for n in names):
        out.add("slow")
    return out
