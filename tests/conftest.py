"""Fixtures shared by the test files."""

import os
import sys

import pytest
import torch


@pytest.fixture
def single_thread():
    """One intra-op thread in the parent (inherited by forked children); environment and threads restored after."""
    environment, threads = dict(os.environ), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = "1"  # keeps Lightning from raising the children's thread count again
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(environment)


@pytest.fixture(autouse=True, scope="session")
def command_line_of_no_command():
    """``sys.argv`` without pytest's own arguments, for the whole session (module fixtures run commands too): the
    tests give each command its arguments (``args=``), and LightningCLI warns when ``sys.argv`` holds others too (and
    reads them where a test passes none)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", sys.argv[:1])
        yield


# The default suite's heaviest end-to-end checks (each 7 s or more on the project's 2-core VM, measured with
# `pytest --durations=60`): marked `heavy` so that `pytest` stays within about ten minutes there. They are not
# dropped: `pytest -m heavy` runs them, and .ci/run does on every change. A file named alone: every test in it (a
# module fixture that builds runs for all of them); a test named: every case of it.
HEAVY = (
    "tests/runs/test_preemption.py::test_a_fit_stopped_by_sigterm_resumes_to_the_uninterrupted_run",
    "tests/lightning_modules/test_stitching.py::test_rotation_oracle_the_recipe_from_identity_recovers",
    "tests/figures/test_runs_side_by_side.py",
    "tests/cli/test_command_help.py::test_trainer_command_help_is_rendered_once_then_read_without_lightning",
    "tests/cli/test_cli.py::test_quickstart_config_one_short_epoch",
    "tests/cli/test_cli.py::test_the_quickstart_prints_no_upstream_noise",
    "tests/cli/test_cli.py::test_transfer_configs_pretrain_then_probe_a_checkpoint",
    "tests/cli/test_cli.py::test_python_dash_m_layerwise_works",
    "tests/callbacks/test_loggers.py::test_tensorboard_wandb_and_mlflow_at_once_receive_the_same_images_and_per_layer_values",
    "tests/runs/test_dead_rank.py::test_rank_1_killed_mid_epoch_ends_rank_0_within_the_bound_naming_it",
    "tests/runs/test_console.py",
    "tests/figures/test_registry.py::test_a_users_analysis_is_drawn_by_training_plot_and_report_alike",
    "tests/runs/test_logger_matrix.py::test_tensorboard_as_shipped",
    "tests/figures/test_figures.py::test_every_pdf_the_package_writes_embeds_truetype_fonts_not_type3",
    "tests/figures/test_print.py::test_the_report_embeds_figures_at_150_dpi_shown_at_their_print_size",
    "tests/figures/test_print.py::test_one_colour_per_quantity_and_per_layer_in_figures_report_and_tensorboard",
    "tests/figures/test_hostile_summaries.py::test_every_reader_draws_or_says_one_line_imports_nothing_and_writes_only_its_output",
    "tests/lightning_modules/test_tuned_lens.py::test_the_shipped_digits_config_fits_writes_the_lens_and_resumes",
    "tests/callbacks/test_transfer.py::test_every_validation_dataloader_is_reported_under_its_own_name",
    "tests/callbacks/test_callbacks.py::test_figures_are_drawn_at_their_cadence_and_at_the_last_epoch",
    "tests/project/test_packaging.py::test_the_core_imports_without_the_extras_and_names_the_extra_when_needed",
    "tests/runs/test_evaluation_runs.py::test_a_second_evaluation_of_a_checkpoint_keeps_the_first",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`HEAVY` (by file, or by test with every case)."""
    for item in items:
        name = item.nodeid.split("[")[0]
        if name in HEAVY or name.split("::")[0] in HEAVY:
            item.add_marker(pytest.mark.heavy)
