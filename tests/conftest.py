"""Shared test fixtures: real captures from fixtures/, each analyzed once per session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import nsysan

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden"
# Other people's public profiles: read in place, never copied into the project.
CORPUS = ROOT.parent / "shared" / "corpus"
# Fixtures whose .sqlite export ships with the project.
CAPTURES = ["known_mem_v25", "known_bt_v25", "known_plain_v25", "known_mem_v22", "torch_leak_v25",
            "torch_clean_v25", "torch_oom_v25", "torch_expandable_v25", "ddp_leak_v25", "real_oom_v25"]

_cache: dict[str, nsysan.Analysis] = {}


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """Every test its own empty cache (exports and analyses): nothing read from, or left in, the
    user's ~/.cache/nsysan, and no test reuses what another one analyzed."""
    cache = tmp_path_factory.mktemp("nsysan-cache")
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(cache))
    return cache


def analysis_of(name: str) -> nsysan.Analysis:
    """The Analysis of fixtures/<name>.sqlite, computed once per session."""
    if name not in _cache:
        _cache[name] = nsysan.analyze(FIXTURES / f"{name}.sqlite")
    return _cache[name]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`nsysan ARGS` in this process (a subprocess per case would take minutes);
    a traceback would leave main() as an exception other than SystemExit and fail the test."""
    from nsysan.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def truth(name: str) -> list[dict]:
    """The records of fixtures/<name>.truth.jsonl (what the captured program did)."""
    lines = (FIXTURES / f"{name}.truth.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="session")
def known_mem_v25() -> nsysan.Analysis:
    return analysis_of("known_mem_v25")


@pytest.fixture(scope="session")
def known_bt_v25() -> nsysan.Analysis:
    return analysis_of("known_bt_v25")


@pytest.fixture(scope="session")
def ddp_leak_v25() -> nsysan.Analysis:
    return analysis_of("ddp_leak_v25")


@pytest.fixture(scope="session")
def torch_leak_v25() -> nsysan.Analysis:
    return analysis_of("torch_leak_v25")


@pytest.fixture(scope="session")
def torch_expandable_v25() -> nsysan.Analysis:
    return analysis_of("torch_expandable_v25")


@pytest.fixture(scope="session")
def known_plain_v25() -> nsysan.Analysis:
    return analysis_of("known_plain_v25")


@pytest.fixture(scope="session")
def real_oom_v25() -> nsysan.Analysis:
    return analysis_of("real_oom_v25")


@pytest.fixture(scope="session")
def known_mem_v22() -> nsysan.Analysis:
    return analysis_of("known_mem_v22")


@pytest.fixture(scope="session")
def torch_pybt_v25() -> nsysan.Analysis:
    return analysis_of("torch_pybt_v25")


@pytest.fixture(scope="session")
def torch_ops_v25() -> nsysan.Analysis:
    return analysis_of("torch_ops_v25")


def nsys_required() -> bool:
    return os.environ.get("NSYSAN_REQUIRE_NSYS") == "1"


@pytest.fixture(scope="session")
def nsys_path() -> Path:
    """The installed nsys; tests needing it skip without it, but fail in CI (NSYSAN_REQUIRE_NSYS=1)."""
    from nsysan.errors import NsysanError
    from nsysan.sources.export import find_nsys

    try:
        return find_nsys()
    except NsysanError as err:
        if nsys_required():
            pytest.fail(f"NSYSAN_REQUIRE_NSYS=1 but nsys is not usable: {err.message}")
        pytest.skip("Nsight Systems (nsys) is not installed")


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present")
    return CORPUS


def has_tool(name: str) -> bool:
    return shutil.which(name) is not None


# The tests that take about 1.5 s or more on two cores (pytest --durations=0 over the whole suite,
# twice on 1 December 2026): `python -m pytest -m "not slow"` leaves them out for the edit loop; CI and the
# README's command run everything. A test is named by file and function, all its parameters alike.
SLOW_TESTS = frozenset({
    # 2 December: the page tests of issue 29 and others of 2 s or more in that day's whole-suite run
    "test_page_narrow.py::test_no_cell_is_narrower_than_its_longest_word",
    "test_page_stacks.py::test_printed_headings_keep_with_what_they_head",
    "test_documents.py::test_compare_and_check_exit_2_with_one_line",
    "test_terminal_width.py::test_every_fixture_reads_whole_at_80_100_and_120_columns",
    "test_page_explorer.py::test_without_javascript_the_png_timeline_stands_in_on_screen_and_on_paper",
    "test_page_narrow.py::test_a_long_table_prints_its_top_rows_and_says_how_many_more",
    "test_page_explorer.py::test_a_long_runs_steps_chart_breaks_where_steps_are_not_listed",
    "test_adversarial.py::test_named_tables_through_the_command_line_and_the_api",
    "test_page_leaks.py::test_the_click_list_groups_by_site_and_says_what_it_counts_over",
    "test_page_explorer.py::test_zoom_rescales_the_y_axis_to_the_visible_lines",
    "test_page_leaks.py::test_operator_ranges_are_a_level_of_their_own",
    "test_page_leaks.py::test_the_page_shows_the_leak_as_its_first_row_and_names_it",
    "test_page_explorer.py::test_keys_pan_and_zoom_the_time_axis",
    "test_page_bytes.py::test_the_stacked_area_draws_each_steps_classes",
    "test_page_explorer.py::test_steps_are_one_row_holding_their_phases_bytes",
    "test_page_stacks.py::test_the_flame_graph_of_the_peak_sums_to_the_peak_and_the_timeline",
    "test_page_explorer.py::test_touch_drags_pan_and_two_fingers_pinch_the_chart",
    "test_page_narrow.py::test_the_call_stacks_of_the_top_sites_print",
    "test_page_explorer.py::test_a_family_sums_every_name_and_matches_the_steps_table",
    "test_page_explorer.py::test_nested_tracks_appear_as_you_zoom_in",
    "test_page_leaks.py::test_axis_readout_legend_click_list_and_tables_tell_one_time_in_one_unit",
    "test_iterations.py::test_streamed_kernel_steps_are_the_whole_frame_ones",
    "test_adversarial.py::test_a_row_moved_far_changes_nothing_and_costs_nothing",
    "test_adversarial.py::test_adversarial_rows_give_one_answer_on_both_paths",
    "test_adversarial.py::test_named_adversarial_tables",
    "test_allocator.py::test_xla_preallocation_is_recognized",
    "test_analysis_cache.py::test_batch_again_reads_every_report_back",
    "test_analysis_cache.py::test_check_then_compare_analyzes_each_run_once",
    "test_analysis_cache.py::test_concurrent_writers_of_one_entry_leave_readers_a_whole_document",
    "test_analysis_cache.py::test_other_options_other_code_or_other_bytes_analyze_again",
    "test_baseline_out.py::test_check_writes_the_run_it_checked_as_the_next_baseline",
    "test_batch.py::test_an_existing_dask_cluster_gives_the_same_numbers",
    "test_batch.py::test_ctrl_c_keeps_what_is_done",
    "test_batch.py::test_dask_gives_the_same_numbers",
    "test_batch.py::test_dask_local_workers_get_the_allocator_settings_before_their_threads",
    "test_batch.py::test_db_appends_across_runs_keyed_by_content",
    "test_batch.py::test_exit_codes",
    "test_batch.py::test_fleet_view_names_the_rank_that_leaks",
    "test_rank_reports.py::test_documents_read_back_give_the_same_departure",
    "test_rank_reports.py::test_each_report_names_its_rank_and_its_clock",
    "test_rank_reports.py::test_batch_names_the_rank_report_step_and_site_that_departed",
    "test_rank_reports.py::test_ranks_inside_one_report_depart_as_analyze_says",
    "test_rank_reports.py::test_the_database_aligns_the_ranks_steps_on_one_clock",
    "test_rank_reports.py::test_a_rank_found_twice_names_no_departure",
    "test_batch.py::test_one_row_per_readable_report_and_one_failed_row_per_bad_one",
    "test_batch.py::test_the_queries_of_the_docs",
    "test_batchsafe.py::test_a_stopped_batch_leaves_no_process_and_a_database_a_rerun_completes",
    "test_batchsafe.py::test_summary_columns_are_as_wide_as_their_content",
    "test_bounded_memory.py::test_check_judges_the_streamed_full_analysis_as_the_whole_frame",
    "test_bounded_memory.py::test_shuffled_rows_chunked_and_whole_give_one_document",
    "test_bounded_memory.py::test_small_chunks_give_the_whole_table_document",
    "test_bounded_memory.py::test_streamed_full_holds_every_call_when_events_fall_outside_their_calls",
    "test_bounded_memory.py::test_streamed_full_joins_calls_out_of_time_order",
    "test_bounded_memory.py::test_streamed_full_sections_are_the_whole_frame_ones",
    "test_bounded_memory.py::test_streamed_full_sites_from_native_and_python_stacks",
    "test_bounded_memory.py::test_streamed_full_window_holds_a_few_chunks_of_calls_in_runs",
    "test_bounded_memory.py::test_streamed_quick_gives_the_whole_frame_document",
    "test_bounded_memory.py::test_streamed_quick_is_what_the_command_line_writes",
    "test_bounded_memory.py::test_streamed_quick_keeps_bad_pool_rows_as_the_whole_frame",
    "test_bounded_memory.py::test_streamed_quick_reads_the_table_again_when_the_batches_cannot_be_kept",
    "test_check.py::test_growth_per_step_limit",
    "test_check.py::test_junit_json_and_markdown_outputs",
    "test_check.py::test_limits_from_pyproject_and_nsysan_toml",
    "test_check_measured.py::test_a_baseline_without_a_matching_process_is_not_measured",
    "test_check_measured.py::test_growth_hidden_by_a_preallocation_is_not_measured",
    "test_check_measured.py::test_numbers_keep_the_digits_that_tell_them_apart",
    "test_check_measured.py::test_the_json_verdict_carries_the_status",
    "test_ci_doc.py::test_the_example_repository_end_to_end",
    "test_cli.py::test_a_reader_that_leaves_early_is_not_an_error",
    "test_cli.py::test_analyze_json_to_stdout_is_the_document",
    "test_cli.py::test_analyze_prints_the_summary",
    "test_cli.py::test_bad_input_is_one_clear_line",
    "test_cli.py::test_failed_cudamalloc_is_shown",
    "test_cli.py::test_json_option_writes_the_file_and_keeps_the_text_summary",
    "test_cli.py::test_nothing_from_the_profiled_environment_is_printed",
    "test_cli.py::test_report_goes_through_a_real_nsys_export",
    "test_cli.py::test_report_newer_than_nsys_is_one_clear_line",
    "test_cli.py::test_several_inputs_give_one_document_each",
    "test_cli.py::test_the_input_file_is_never_modified",
    "test_compare.py::test_compare_json_and_folder",
    "test_compare_page.py::test_compare_page_at_420_px_and_on_paper",
    "test_compare_page.py::test_compare_page_in_chromium",
    "test_corpus.py::test_corpus_file_gives_analysis_or_one_clear_error",
    "test_docs.py::test_console_example_prints_what_the_docs_show",
    "test_documents.py::test_a_document_with_any_field_changed_is_refused_in_one_line_or_used_whole",
    "test_export.py::test_corpus_report_exports_or_fails_in_one_line",
    "test_files.py::test_a_full_disk_half_way_leaves_the_last_report_whole",
    "test_files.py::test_all_files_are_replaced_when_all_fit",
    "test_growth.py::test_a_bad_step_range_is_one_line_and_exit_2",
    "test_growth.py::test_no_trailing_spaces_and_one_time_unit_per_column",
    "test_growth.py::test_the_answers_come_right_after_the_capture_box",
    "test_growth.py::test_version",
    "test_growth.py::test_warnings_about_the_numbers_come_before_the_tables",
    "test_hostile.py::test_a_failed_run_keeps_the_previous_report_folder_whole",
    "test_hostile.py::test_a_stop_during_an_export_is_one_line_and_leaves_no_reusable_entry",
    "test_hostile.py::test_debug_output_of_a_failing_run_holds_no_environment",
    "test_hostile.py::test_every_bad_input_gives_one_line_or_a_diagnosed_analysis",
    "test_hostile.py::test_full_disk_keeps_the_previous_json_and_leaves_no_partial_file",
    "test_hostile.py::test_full_disk_never_leaves_a_report_folder_that_looks_complete",
    "test_hostile.py::test_json_into_a_pipe_is_streamed_not_replaced",
    "test_hostile.py::test_json_that_cannot_be_written_is_one_line_and_leaves_nothing",
    "test_hostile.py::test_json_through_a_symlink_updates_the_file_it_points_to",
    "test_hostile.py::test_outputs_are_readable_by_others_like_any_new_file",
    "test_hostile.py::test_profile_strings_are_only_escaped_in_the_html_report",
    "test_hostile.py::test_profile_strings_never_drive_the_terminal",
    "test_hostile.py::test_read_only_report_and_folder_get_nothing_written",
    "test_hostile.py::test_the_profiled_environment_never_reaches_terminal_json_or_html",
    "test_hostile.py::test_two_analyses_of_one_report_at_once_share_the_cache",
    "test_hostile2.py::test_a_closed_stderr_keeps_the_exit_codes_and_the_outputs_whole",
    "test_hostile2.py::test_a_closed_stdout_is_one_line_and_exit_2",
    "test_hostile2.py::test_a_damaged_sibling_falls_back_to_exporting_the_report",
    "test_hostile2.py::test_a_fifo_as_sibling_or_cache_entry_is_passed_by",
    "test_hostile2.py::test_a_file_name_that_is_not_utf8_is_shown_with_escapes_and_kept_apart",
    "test_hostile2.py::test_a_hostile_file_name_is_inert_in_the_progress_bar",
    "test_hostile2.py::test_a_hostile_file_name_is_inert_in_the_summary_the_report_line_and_errors",
    "test_hostile2.py::test_a_hot_journal_is_rolled_back_in_a_private_copy_never_read_torn",
    "test_hostile2.py::test_a_huge_columns_value_does_not_blow_up_the_summary",
    "test_hostile2.py::test_a_live_writer_is_refused_in_one_line",
    "test_hostile2.py::test_a_relative_xdg_cache_home_is_ignored",
    "test_hostile2.py::test_a_sibling_that_is_not_the_reports_export_is_not_used",
    "test_hostile2.py::test_a_special_file_as_input_is_named_not_opened",
    "test_hostile2.py::test_a_timeout_that_is_no_number_is_one_line",
    "test_hostile2.py::test_an_ascii_console_gets_escapes_not_a_crash",
    "test_hostile2.py::test_an_error_with_stderr_on_a_full_device_still_exits_2",
    "test_hostile2.py::test_committed_transactions_in_a_write_ahead_log_are_read",
    "test_hostile2.py::test_json_dir_with_two_reports_of_one_name_is_refused",
    "test_hostile2.py::test_json_inside_the_report_folder_is_the_same_document_so_both_are_written",
    "test_hostile2.py::test_no_output_replaces_an_input",
    "test_hostile2.py::test_odd_export_timeouts_mean_no_limit",
    "test_hostile2.py::test_stdout_into_a_file_that_cannot_grow_is_one_line_and_exit_2",
    "test_hostile2.py::test_stdout_on_a_full_device_is_one_line_and_exit_2",
    "test_hostile2.py::test_ten_megabyte_names_are_cut_for_the_terminal_and_the_json",
    "test_hostile2.py::test_the_reports_own_sibling_is_used_and_the_output_says_so",
    "test_hostile2.py::test_the_sibling_export_of_a_report_is_an_input_too",
    "test_hostile2.py::test_thousands_of_processes_or_hundreds_of_devices_stay_bounded",
    "test_hostile2.py::test_unbuffered_json_through_a_pipe_is_whole",
    "test_html.py::test_analyze_output_not_writable_is_one_line_and_exit_2",
    "test_html.py::test_analyze_output_refuses_two_reports_of_the_same_name",
    "test_html.py::test_analyze_output_with_several_reports_and_json",
    "test_html.py::test_analyze_output_writes_the_report",
    "test_html.py::test_csp_stops_a_script_that_escaping_missed",
    "test_html.py::test_nvtx_range_named_script_is_text_in_chromium",
    "test_html.py::test_page_and_pngs_come_from_the_model_alone",
    "test_html.py::test_page_names_the_report_file_and_full_paths_brings_the_path_back",
    "test_html.py::test_printed_report_repeats_table_headers_with_their_text",
    "test_html.py::test_report_at_420_px_has_no_page_scroll",
    "test_html.py::test_report_in_chromium",
    "test_html.py::test_report_of_every_fixture_is_small_and_self_contained",
    "test_html.py::test_the_browser_checks_do_see_requests_and_dialogs",
    "test_html.py::test_write_report_writes_the_page_the_plots_and_the_json",
    "test_layout.py::test_only_schema_and_events_read_name_nsys_tables",
    "test_memory_budget.py::test_a_budget_under_the_whole_frame_streams_the_same_document",
    "test_memory_budget.py::test_max_memory_in_a_batch",
    "test_memory_budget.py::test_max_memory_on_the_command_line",
    "test_notebook.py::test_check_mirrors_the_command",
    "test_notebook.py::test_compare_mirrors_the_command",
    "test_notebook.py::test_every_table_has_one_row_per_object",
    "test_notebook.py::test_notebook_session_on_torch_leak",
    "test_notebook.py::test_repr_html_in_chromium",
    "test_page_marks.py::test_an_oom_without_a_failed_call_is_marked_where_the_allocator_gave_up",
    "test_page_marks.py::test_the_interactive_timeline_draws_nvidia_smi",
    "test_phases.py::test_a_bad_spike_window_is_one_line_and_exit_2",
    "test_platforms.py::test_code_parses_as_python_3_10",
    "test_platforms.py::test_imports_and_analyzes_without_fcntl_and_sighup",
    "test_platforms.py::test_text_output_in_a_narrow_code_page_escapes_what_it_cannot_encode",
    "test_png.py::test_ddp_timeline_has_one_panel_per_gpu",
    "test_png.py::test_sites_chart_overlays_never_freed_bytes",
    "test_png.py::test_timeline_png_is_a_real_picture",
    "test_property.py::test_a_mutated_export_is_analyzed_or_refused_in_one_line",
    "test_python_api.py::test_docstring_examples_run",
    "test_python_api.py::test_python_doc_examples_run",
    "test_quick.py::test_quick_needs_the_memory_table",
    "test_quick.py::test_quick_on_the_command_line",
    "test_reader.py::test_a_reordering_applied_in_place_equals_the_gather",
    "test_reader.py::test_factorize_in_parts_numbers_equal_values_alike",
    "test_reader.py::test_previous_in_group_is_the_last_row_of_the_same_code",
    "test_sites.py::test_largest_python_sites_of_torch_pybt",
    "test_smi.py::test_a_log_in_another_zone",
    "test_smi.py::test_hostile_logs_through_the_command",
    "test_smi.py::test_logs_are_on_the_trace_clock_without_options",
    "test_smi.py::test_not_in_the_trace_per_sample",
    "test_smi.py::test_terminal_json_and_round_trip",
    "test_smi.py::test_two_gpus_by_index_and_bus_with_an_untraced_process",
    "test_stream_nvtx.py::test_ranges_batch_by_batch_with_rows_out_of_time_order",
    "test_stream_nvtx.py::test_ranges_found_batch_by_batch_are_the_whole_frame_ones",
    "test_streamed_steps.py::test_streamed_growth_of_the_leaks",
    "test_streamed_steps.py::test_streamed_steps_named_by_step_range",
    "test_streamed_verdicts.py::test_streamed_allocators_and_caps",
    "test_streamed_verdicts.py::test_streamed_cache_flush_when_the_allocator_went_on",
    "test_streamed_verdicts.py::test_streamed_spike_within_a_range_names_its_calls_and_sites",
    "test_streamed_windows.py::test_range_windows_read_the_most_live_while_open",
    "test_engine.py::test_step_tables_of_two_ranks_in_3_row_batches",  # 1,516 batches
    "test_stream_spill.py::test_a_full_disk_reads_the_tables_again_and_the_document_is_the_same",  # 3 s
})


def pytest_collection_modifyitems(items):
    for item in items:
        if f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
