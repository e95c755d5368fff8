"""Where a command's results go and what it says: evaluations beside their checkpoint's run,
labelled by its epoch and step; `predict` without a log folder; `plot` drawing the latest fit run; the split a `test`
really evaluated; the line a fit ends with; a fit that would train nothing refused."""

import contextlib
import io
import json
import os
import time
import warnings
from pathlib import Path

import pytest
import torch

import layerwise
from layerwise.cli import LayerwiseCLI, main
from layerwise.results import write_text_atomic

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
TINY = [
    "--model.init_args.backbone.init_args.embed_dim=16",
    "--model.init_args.backbone.init_args.depth=2",
    "--model.init_args.backbone.init_args.num_heads=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.limit_predict_batches=1",
]


def run_cli(save_dir: Path, *args: str) -> tuple[LayerwiseCLI, str, list[str]]:
    """One LayerwiseCLI command on the tiny quickstart; returns it, its standard output and its warnings."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = LayerwiseCLI(
            args=[args[0], "--config", QUICKSTART, *TINY, f"--trainer.logger.init_args.save_dir={save_dir}", *args[1:]]
        )
    return cli, out.getvalue(), [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, str]:
    """A two-epoch fit of the tiny quickstart (2 steps per epoch): its save_dir and its output."""
    save_dir = tmp_path_factory.mktemp("runs")
    _, output, _ = run_cli(save_dir, "fit", "--trainer.max_epochs=2", "--trainer.limit_train_batches=2")
    return save_dir, output


def folders(save_dir: Path) -> set[Path]:
    return {path for path in save_dir.rglob("*") if path.is_dir()}


def test_a_fit_ends_with_one_line_naming_accuracy_checkpoints_summaries_and_figures(fitted):
    save_dir, output = fitted
    run = save_dir / "quickstart" / "version_0"
    closing = output.strip().splitlines()[-1]
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    best = checkpoint["callbacks"][next(k for k in checkpoint["callbacks"] if "'monitor': 'val/acc'" in k)]
    last = json.loads(sorted((run / "layerwise").glob("val_epoch_*.json"))[-1].read_text())
    assert closing.startswith("layerwise fit: 2 epochs, step 4; ")
    assert f"val/acc best {float(best['best_model_score']):.4f}, last {last['accuracy'][-1]:.4f}" in closing
    assert f"checkpoints {run / 'checkpoints'}/ (" in closing and "last.ckpt" in closing
    assert f"summaries {run / 'layerwise'}/" in closing and f"`layerwise plot {run}`" in closing
    assert f"figures in TensorBoard ({run}) and by" in closing
    assert closing.endswith(f"; layerwise {layerwise.__version__}.")  # which layerwise made these results
    assert last["layerwise_version"] == layerwise.__version__


def test_the_closing_line_names_where_the_figures_went_without_tensorboard(tmp_path):
    """A CSV logger gets PNG files; the line says so rather than naming a TensorBoard the run does not have."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LayerwiseCLI(
            args=[
                "fit",
                "--config",
                QUICKSTART,
                *TINY,
                "--trainer.logger=CSVLogger",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2",
            ]
        )
    closing = out.getvalue().strip().splitlines()[-1]
    assert closing.startswith("layerwise fit: 1 epoch, step 2; "), closing
    images = tmp_path / "quickstart" / "version_0" / "layerwise" / "images"
    assert "TensorBoard" not in closing and f"figures in PNG files in {images}/ and by" in closing, closing
    assert list(images.rglob("*.png")), "the line names a folder the figures are not in"


def test_a_resumed_fit_that_trains_nothing_says_so(fitted, tmp_path):
    save_dir, _ = fitted
    checkpoint = save_dir / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    _, output, _ = run_cli(tmp_path, "fit", "--trainer.max_epochs=2", f"--ckpt_path={checkpoint}")
    assert "layerwise fit: nothing was trained (resumed at step 4, max_epochs=2" in output.strip().splitlines()[-1]


def test_max_epochs_zero_is_refused_before_any_folder_is_made(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(
            args=[
                "fit",
                "--config",
                QUICKSTART,
                *TINY,
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                "--trainer.max_epochs=0",
            ]
        )
    assert exit_info.value.code == 2
    assert "layerwise fit: error: `--trainer.max_epochs=0` trains nothing" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command, stage", [("validate", "val"), ("test", "test")])
def test_an_evaluation_is_labelled_and_filed_by_its_checkpoint(fitted, command, stage):
    save_dir, _ = fitted
    run = save_dir / "quickstart" / "version_0"
    checkpoint = run / "checkpoints" / "epoch=0-step=2.ckpt"  # not the last state: epoch 0, step 2
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    label = f"epoch_{saved['epoch']:03d}_step_{saved['global_step']:07d}"
    before = folders(save_dir)
    cli, output, caught = run_cli(save_dir, command, f"--ckpt_path={checkpoint}")
    folder = run / f"{command}_{label}"
    assert cli.trainer.log_dir == str(folder)
    summary = json.loads((folder / "layerwise" / f"{stage}_{label}.json").read_text())
    assert (summary["epoch"], summary["global_step"]) == (saved["epoch"], saved["global_step"]) == (0, 2)
    new = folders(save_dir) - before
    layer_runs = {path for path in new if path.is_relative_to(folder / "layers")}  # TensorBoard's run per layer
    threshold_runs = {path for path in new if path.is_relative_to(folder / "thresholds")}  # and per τ / ε
    assert threshold_runs and all(
        path.name[:4] in ("tau_", "eps_") for path in threshold_runs - {folder / "thresholds"}
    )
    assert new - layer_runs - threshold_runs == {folder, folder / "layerwise"}  # no new version_N beside the run
    assert layer_runs == {folder / "layers"} | {folder / "layers" / f"layer_{n:02d}" for n in range(1, len(layer_runs))}
    assert not any("dirpath has changed" in message for message in caught)
    assert f"layerwise {command}: checkpoint {checkpoint} (epoch 0, step 2) -> {folder}" in output.splitlines()


def test_a_second_evaluation_of_a_checkpoint_keeps_the_first(fitted):
    save_dir, _ = fitted
    run = save_dir / "quickstart" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    first, _, _ = run_cli(save_dir, "validate", f"--ckpt_path={checkpoint}")
    second, _, _ = run_cli(save_dir, "validate", f"--ckpt_path={checkpoint}")
    assert Path(second.trainer.log_dir) == Path(first.trainer.log_dir).with_name(
        f"{Path(first.trainer.log_dir).name}-v1"
    )
    assert (Path(first.trainer.log_dir) / "layerwise" / "val_epoch_001_step_0000004.json").exists()


def test_predict_leaves_no_folder(fitted):
    save_dir, _ = fitted
    checkpoint = save_dir / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    before = {path for path in save_dir.rglob("*")}
    cli, _, caught = run_cli(save_dir, "predict", f"--ckpt_path={checkpoint}")
    assert cli.trainer.predict_loop.predictions  # it did predict
    assert {path for path in save_dir.rglob("*")} == before
    assert not any("dirpath has changed" in message for message in caught)


def test_test_without_a_test_split_says_which_split_it_evaluated(fitted):
    save_dir, _ = fitted
    checkpoint = save_dir / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    cli, output, _ = run_cli(save_dir, "test", f"--ckpt_path={checkpoint}")
    assert "layerwise test: DigitsDataModule has no test split; testing its validation split" in output
    summary = json.loads(next((Path(cli.trainer.log_dir) / "layerwise").glob("test_epoch_*.json")).read_text())
    assert summary["stage"] == "test" and summary["split"] == "validation"
    validation = json.loads(
        sorted((save_dir / "quickstart" / "version_0" / "layerwise").glob("val_*.json"))[-1].read_text()
    )
    assert validation["split"] == "validation"


def write_run(folder: Path, epochs: int, step_per_epoch: int = 10) -> None:
    for epoch in range(epochs):
        name = f"val_epoch_{epoch:03d}_step_{(epoch + 1) * step_per_epoch:07d}.json"
        write_text_atomic(folder / "layerwise" / name, json.dumps({"epoch": epoch}))


def test_plot_draws_the_latest_fit_run_and_says_which(tmp_path, capsys, monkeypatch):
    drawn = []
    monkeypatch.setattr(
        "layerwise.figures.plot.plot_summary", lambda file, out, formats, width, *registered: drawn.append(file) or []
    )
    older, newer = tmp_path / "exp" / "version_0", tmp_path / "exp" / "version_1"
    write_run(older, epochs=5)
    write_run(newer, epochs=1)  # a newer, shorter fit
    evaluation = older / "validate_epoch_004_step_0000050"  # an evaluation, newest of all: not a fit run
    write_text_atomic(evaluation / "layerwise" / "val_epoch_004_step_0000050.json", "{}")
    stamp = time.time()
    for offset, folder in enumerate((older, newer, evaluation)):
        for file in (folder / "layerwise").glob("*.json"):
            os.utime(file, (stamp + offset, stamp + offset))
    main(["plot", str(tmp_path / "exp")])
    assert [file.parent.parent for file in drawn] == [newer]
    assert f"layerwise plot: drawing run {newer} (the latest fit run of the 3 runs under {tmp_path / 'exp'})" in (
        capsys.readouterr().out
    )
    drawn.clear()
    main(["plot", str(older)])  # a run named: that run, not its evaluation
    assert [file.parent.parent for file in drawn] == [older]
    assert capsys.readouterr().out == f"layerwise plot: drawing run {older}\n"


def test_every_datamodule_without_a_test_split_names_the_split_it_tests():
    """COCO and HANS test their validation images; a text source tests its test split only when it has one."""
    from types import SimpleNamespace

    from layerwise.datamodules.coco import COCODetectionDataModule
    from layerwise.datamodules.hans import HANSDataModule
    from layerwise.datamodules.text import TextDataModule
    from layerwise.results import evaluated_split

    assert evaluated_split(COCODetectionDataModule, "test") == "validation"
    assert evaluated_split(HANSDataModule, "test") == "validation"
    assert TextDataModule.test_split.fget(SimpleNamespace(test_blocks=None)) == "validation"
    assert TextDataModule.test_split.fget(SimpleNamespace(test_blocks=[1])) == "test"


def test_a_second_fit_into_the_same_folder_keeps_the_first_runs_config_and_summaries(tmp_path):
    """Without a logger runs share --trainer.default_root_dir: the first run's files are moved aside, never lost."""

    def fit() -> list[str]:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            LayerwiseCLI(
                args=[
                    "fit",
                    "--config",
                    QUICKSTART,
                    *TINY,
                    "--trainer.logger=false",
                    f"--trainer.default_root_dir={tmp_path}",
                    "--trainer.max_epochs=1",
                    "--trainer.limit_train_batches=2",
                ]
            )
        return [str(w.message) for w in caught]

    fit()
    config = (tmp_path / "config.yaml").read_text()
    summaries = {path.name: path.read_text() for path in (tmp_path / "layerwise").glob("*.json")}
    assert summaries
    messages = fit()
    assert any("held the config of an earlier run" in message for message in messages), messages
    assert any("held the summary of an earlier run" in message for message in messages), messages
    kept = list(tmp_path.glob("config.yaml.earlier-*"))
    assert len(kept) == 1 and kept[0].read_text() == config
    for name, text in summaries.items():
        (aside,) = (tmp_path / "layerwise").glob(f"{name}.earlier-*")
        assert aside.read_text() == text


@pytest.mark.parametrize("given", ["name", "save_dir"])
def test_a_logger_name_or_folder_the_user_typed_wins_over_the_placement_beside_the_run(fitted, tmp_path, given):
    save_dir, _ = fitted
    checkpoint = save_dir / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    before = folders(save_dir)
    if given == "name":
        cli, output, _ = run_cli(
            save_dir, "validate", f"--ckpt_path={checkpoint}", "--trainer.logger.init_args.name=val_one"
        )
        expected = save_dir / "val_one" / "version_0"
    else:
        elsewhere = tmp_path / "elsewhere"
        cli, output, _ = run_cli(elsewhere, "validate", f"--ckpt_path={checkpoint}")
        expected = elsewhere / "quickstart" / "version_0"
    assert cli.trainer.log_dir == str(expected)
    assert list((expected / "layerwise").glob("val_epoch_*.json"))
    assert not {f for f in folders(save_dir) - before if "validate_" in f.name}  # nothing beside the fitted run
    assert output.rstrip().splitlines()[-1].endswith(f"-> {expected}")
