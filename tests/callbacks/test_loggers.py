"""Every logger Lightning ships gets the figures and the per-layer charts, read back from its own files.

Real components, offline: W&B in offline mode (its run folder: ``files/media/images`` and the line plots' tables),
MLflow on a local SQLite store read back through ``MlflowClient``, TensorBoard through its event reader, and CSV /
no logger as PNG files in the run folder. Each figure is rendered once; every logger gets the same pixels.
"""

import io
import json
import re
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import fitted_backbone, fitted_module, train_loader, trainer, val_loader
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from layerwise.callbacks import LayerwiseAnalysis, _drawing
from layerwise.callbacks._loggers import ImageSink, image_sinks, mlflow_key
from layerwise.figures import worker
from layerwise.figures.summary import summary_figures
from layerwise.results import find_summaries, load_summary

N = 48


def png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def tensorboard_images(log_dir: str) -> dict[str, dict[int, np.ndarray]]:
    events = EventAccumulator(log_dir, size_guidance={"images": 0})
    events.Reload()
    return {
        tag: {event.step: png(event.encoded_image_string) for event in events.Images(tag)}
        for tag in events.Tags()["images"]
    }


def tensorboard_scalars(log_dir: str, pattern: str) -> dict[str, list[float]]:
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [event.value for event in sorted(events.Scalars(tag), key=lambda event: event.step)]
        for tag in events.Tags()["scalars"]
        if re.fullmatch(pattern, tag)
    }


def summary_steps(log_dir: str) -> list[int]:
    return sorted(load_summary(path)["global_step"] for path in find_summaries(Path(log_dir), all_epochs=True))


def line_plot(tables: Path, title: str, quantity: str) -> dict[str, list[tuple[int, float]]]:
    """The latest W&B line plot ``title`` (a table of step, series, value) as tag -> [(step, value)]."""
    latest = max(
        tables.glob(f"{title}_table_*.json"), key=lambda file: int(file.name.split("_table_")[1].split("_")[0])
    )
    rows = json.loads(latest.read_text())
    assert rows["columns"] == ["step", "lineKey", "lineVal"]
    plotted = defaultdict(list)
    for step, layer, value in rows["data"]:
        plotted[f"val/{quantity}/{layer}"].append((step, value))
    return plotted


def fingerprints(images) -> list[bytes]:
    return sorted(image.tobytes() for image in images)


def test_tensorboard_wandb_and_mlflow_at_once_receive_the_same_images_and_per_layer_values(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is absent (pip install -e '.[loggers]')")
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
    from mlflow import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tensorboard = TensorBoardLogger(str(tmp_path), name="tb")
    weights_and_biases = WandbLogger(save_dir=str(tmp_path), project="layerwise-test", offline=True)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow = MLFlowLogger(experiment_name="layerwise", tracking_uri=store, artifact_location=str(tmp_path / "art"))

    threads = []  # W&B is not thread-safe: every image must reach it from the main thread
    log_image = WandbLogger.log_image

    def spy(self, *args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return log_image(self, *args, **kwargs)

    monkeypatch.setattr(WandbLogger, "log_image", spy)
    fit = trainer(
        tmp_path,
        [LayerwiseAnalysis()],
        logger=[tensorboard, weights_and_biases, mlflow],
        max_epochs=2,
        limit_train_batches=1,
    )
    try:
        fit.fit(fitted_module(), train_loader(), val_loader(N))
    finally:
        wandb.finish()

    expected = tensorboard_images(tensorboard.log_dir)
    charts = {tag for tag in expected if tag.startswith("layerwise val/")}  # TensorBoard's own per-layer chart images
    assert {"layerwise val/NC1 per layer", "layerwise val/COS to last layer"} <= charts
    expected = {tag: by_step for tag, by_step in expected.items() if tag not in charts}
    steps = summary_steps(tensorboard.log_dir)
    assert len(steps) == 2 and {"val/cos", "val/cka", "val/saturation"} <= set(expected)
    assert all(sorted(by_step) == steps for by_step in expected.values())

    # W&B: the offline run's media files, one PNG per tag and validation, the same pixels
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    media = run / "files" / "media" / "images"
    received = defaultdict(list)
    for file in media.rglob("*.png"):
        tag = re.sub(r"_\d+_[0-9a-f]+\.png$", "", file.relative_to(media).as_posix())
        received[tag].append(png(file.read_bytes()))
    assert set(received) == set(expected)
    for tag, by_step in expected.items():
        assert fingerprints(received[tag]) == fingerprints(by_step.values()), tag
    assert threads and all(threads)

    # W&B: one line plot per quantity, one series per layer, the values TensorBoard has (at the summaries' steps)
    tables = run / "files" / "media" / "table" / "layerwise val"
    layers = load_summary(find_summaries(Path(tensorboard.log_dir), stage="val")[-1])["layers"]
    for title, quantity in (("accuracy per layer", "acc"), ("COS to last layer", "cos_to_last")):
        plotted = line_plot(tables, title, quantity)
        scalars = tensorboard_scalars(tensorboard.log_dir, rf"val/{quantity}/layer_\d+")
        assert set(plotted) == set(scalars) and len(scalars) == len(layers), title
        for tag, values in scalars.items():
            assert [step for step, _ in plotted[tag]] == steps
            assert np.allclose([value for _, value in plotted[tag]], values, rtol=1e-6), tag
    assert len({value for values in scalars.values() for value in values}) > 1  # not a constant to agree on

    # MLflow: time-stepped images under the same tags and steps, the same pixels; metrics with the layer in the key
    client = MlflowClient(store)
    artifacts = [item.path for item in client.list_artifacts(mlflow.run_id, "images") if item.path.endswith(".png")]
    found = defaultdict(dict)
    for path in artifacts:
        key, step = re.fullmatch(r"images/(.+)\+step\+(\d+)\+timestamp\+.*\.png", path).groups()
        local = client.download_artifacts(mlflow.run_id, path, str(tmp_path / "download"))
        found[key.replace("~", "/")][int(step)] = png(Path(local).read_bytes())
    assert set(found) == set(expected)
    for tag, by_step in expected.items():
        assert sorted(found[tag]) == steps, tag
        for step, image in by_step.items():
            assert np.array_equal(found[tag][step], image), (tag, step)
    for tag, values in scalars.items():
        history = client.get_metric_history(mlflow.run_id, tag)
        assert np.allclose([metric.value for metric in sorted(history, key=lambda m: m.step)], values), tag


@pytest.fixture
def closed_writers(monkeypatch) -> list[Path]:
    """The folders of the ``SummaryWriter``s closed during the test, in order."""
    from torch.utils.tensorboard import SummaryWriter

    closed, close = [], SummaryWriter.close

    def spy(self):
        closed.append(Path(self.log_dir))
        close(self)

    monkeypatch.setattr(SummaryWriter, "close", spy)
    return closed


class FailsInTheSecondEpoch(type(fitted_module())):
    """Raises at the second epoch's first training step, after one analysed validation."""

    def training_step(self, batch, batch_idx):
        if self.current_epoch == 1:
            raise RuntimeError("the machine went away")
        return super().training_step(batch, batch_idx)


def test_tensorboard_gets_a_run_per_layer_with_one_tag_per_quantity_beside_the_run(tmp_path, closed_writers):
    """``<run>/layers/layer_XX/`` holds ``val/acc``, ... at the summaries' steps; CSV beside it is untouched."""
    tensorboard, csv = TensorBoardLogger(str(tmp_path), name="tb"), CSVLogger(str(tmp_path), name="csv")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=[tensorboard, csv], max_epochs=2, limit_train_batches=1)
    module = fitted_module()
    fit.fit(module, train_loader(), val_loader(N))
    fit.test(module, val_loader(N))  # after the fit's teardown closed them: the layer runs open again

    run = Path(tensorboard.log_dir)
    layers = sorted(folder.name for folder in (run / "layers").iterdir())
    summaries = [load_summary(path) for path in find_summaries(run, all_epochs=True)]
    assert layers == [f"layer_{n:02d}" for n in summaries[0]["layers"]] and len(layers) == 4
    main = tensorboard_scalars(str(run), r".+/layer_\d+")  # what the run itself has, with the layer in the tag
    quantities = {tag.rsplit("/", 1)[0] for tag in main}
    assert {"val/acc", "val/loss", "val/cos_to_last", "val/cka_to_last", "val/nc1", "test/acc"} <= quantities
    for layer in layers:
        events = EventAccumulator(str(run / "layers" / layer), size_guidance={"scalars": 0})
        events.Reload()
        # the same tag in every layer's run, one the run itself never logs (its own val/acc is the model's)
        assert set(events.Tags()["scalars"]) == {f"{quantity}/layers" for quantity in quantities}, layer
        for quantity in quantities:
            points = sorted((event.step, event.value) for event in events.Scalars(f"{quantity}/layers"))
            assert [value for _, value in points] == pytest.approx(main[f"{quantity}/{layer}"], rel=1e-6)
        row = summaries[0]["layers"].index(int(layer.split("_")[1]))
        for stage in ("val", "test"):  # the accuracy against the JSON summaries, step by step
            mine = [summary for summary in summaries if summary["stage"] == stage]
            points = sorted((event.step, event.value) for event in events.Scalars(f"{stage}/acc/layers"))
            assert [step for step, _ in points] == [summary["global_step"] for summary in mine], (layer, stage)
            expected = [summary["accuracy"][row] for summary in mine]
            assert [value for _, value in points] == pytest.approx(expected, abs=1e-6), (layer, stage)
    assert len({value for layer in layers for value in main[f"val/loss/{layer}"]}) > 1  # not one constant
    layer_closes = [folder.name for folder in closed_writers if folder.parent == run / "layers"]
    assert layer_closes == layers + layers  # closed at the fit's teardown, opened again by the test and closed
    assert not (Path(csv.log_dir) / "layers").exists()
    columns = pd.read_csv(Path(csv.log_dir) / "metrics.csv").columns
    assert {f"val/acc/{layer}" for layer in layers} <= set(columns)


def test_the_layer_runs_are_closed_when_the_fit_fails(tmp_path, closed_writers):
    tensorboard = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)], logger=tensorboard, max_epochs=2)
    with pytest.raises(RuntimeError, match="went away"):
        fit.fit(FailsInTheSecondEpoch(fitted_backbone()).train(), train_loader(), val_loader(N))
    run = Path(tensorboard.log_dir)
    assert [folder.name for folder in closed_writers if folder.parent == run / "layers"] == [
        "layer_01",
        "layer_02",
        "layer_03",
        "layer_04",
    ]
    events = EventAccumulator(str(run / "layers" / "layer_01"), size_guidance={"scalars": 0})
    events.Reload()
    assert len(events.Scalars("val/acc/layers")) == 1  # the one validation before the failure, written in full


def test_csv_logger_gets_png_files_in_its_run_folder_never_overwritten(tmp_path):
    logger = CSVLogger(str(tmp_path), name="csv")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=2, limit_train_batches=1)
    module = fitted_module()
    fit.fit(module, train_loader(), val_loader(N))
    folder = Path(logger.log_dir) / "layerwise" / "images" / "val"
    steps = summary_steps(logger.log_dir)
    last = load_summary(find_summaries(Path(logger.log_dir), stage="val")[-1])
    figures = summary_figures(last)
    written = defaultdict(list)
    for file in folder.glob("*.png"):
        tag, step = re.fullmatch(r"(.+)_step_(\d{7})\.png", file.name).groups()
        written[tag].append(int(step))
    assert {"cos", "cka", "saturation", "early_exit"} <= set(written) <= set(figures)
    assert all(sorted(found) == steps for found in written.values())
    image = png((folder / f"cos_step_{steps[-1]:07d}.png").read_bytes())
    assert np.abs(image.astype(int) - worker.rendered(figures["cos"]).astype(int)).mean() < 1.0

    before = (folder / f"cos_step_{steps[-1]:07d}.png").read_bytes()
    fit.validate(module, val_loader(N))  # the same global step again: a second file, the first one untouched
    assert (folder / f"cos_step_{steps[-1]:07d}.png").read_bytes() == before
    assert (folder / f"cos_step_{steps[-1]:07d}_2.png").exists()


def test_without_a_logger_the_pngs_go_to_the_root_folder_and_tensorboard_gets_no_png_files(tmp_path):
    (alone,) = image_sinks(trainer(tmp_path / "none", []))
    assert alone.name.startswith("PNG files") and str(tmp_path / "none" / "layerwise" / "images") in alone.name
    both = trainer(tmp_path, [], logger=[TensorBoardLogger(str(tmp_path), name="tb"), CSVLogger(str(tmp_path))])
    assert [sink.name.split()[0] for sink in image_sinks(both)] == ["TensorBoard", "PNG"]
    assert not image_sinks(trainer(tmp_path, [], logger=TensorBoardLogger(str(tmp_path))))[0].on_main_thread
    assert mlflow_key("val_shift:ü/early_exit/tau_0.9") == "val_shift/early_exit/tau_0.9"  # as Lightning's metric keys


def test_a_logger_that_refuses_an_image_is_skipped_with_a_warning_and_the_others_still_get_it():
    from layerwise.figures.style import new_figure

    received = []

    def refuse(tag, image, step):
        raise ConnectionError("offline")

    def keep(name):
        return lambda tag, image, step: received.append((name, tag, step, threading.current_thread().name))

    sinks = [ImageSink("broken", refuse), ImageSink("main", keep("main"), True), ImageSink("worker", keep("worker"))]
    with pytest.warns(UserWarning, match="could not be logged to broken"):
        _drawing.draw_later(sinks, 3, lambda: {"val/ok": new_figure(2, 2)[0]})
        _drawing.wait_for_figures()
    main = threading.main_thread().name
    assert sorted(received) == [("main", "val/ok", 3, main), ("worker", "val/ok", 3, "layerwise-figures")]


def test_the_quickstarts_commented_alternative_logger_parses_and_builds_csv_wandb_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is absent (pip install -e '.[loggers]')")
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    from layerwise.cli import LayerwiseCLI

    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    lines = quickstart.read_text().splitlines()
    start = lines.index("  # logger:")
    block = ["trainer:"]
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append("  " + line[len("  # ") :])
    alternative = tmp_path / "alternative.yaml"
    alternative.write_text("\n".join(block) + "\n")
    monkeypatch.chdir(tmp_path)  # the config's folders are relative: runs/, runs/mlflow.db
    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = LayerwiseCLI(args=["--config", str(quickstart), "--config", str(alternative)], run=False)
    assert [type(logger) for logger in cli.trainer.loggers] == [CSVLogger, WandbLogger, MLFlowLogger]
    assert [sink.name.split()[0] for sink in image_sinks(cli.trainer)] == ["W&B", "MLflow", "PNG"]


def test_mlflow_on_a_database_as_the_first_logger_is_one_line_naming_the_option(tmp_path, monkeypatch, capsys):
    """Lightning takes the run folder from the first logger; MLflow on SQLite has none: one line, not an assert."""
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    from layerwise.cli import LayerwiseCLI

    monkeypatch.chdir(tmp_path)
    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(
            args=[
                "fit",
                "--config",
                str(quickstart),
                "--trainer.logger=MLFlowLogger",
                f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                "--trainer.max_epochs=1",
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err and "AssertionError" not in err, err
    assert (
        "`--trainer.logger`" in lines[0]
        and "MLFlowLogger" in lines[0]
        and "TensorBoardLogger or CSVLogger first" in lines[0]
    )
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("lightning_logs")), (
        "work started before the error"
    )


def test_every_custom_scalars_chart_per_layer_holds_exactly_the_layers_and_one_run_per_threshold(tmp_path):
    """Issue 52: "val accuracy per layer" held 7 lines for 6 layers (the run's own ``val/acc`` matched its regex
    beside the layer runs'), the early-exit charts seven τ lines in the run's one colour. A Custom Scalars chart
    draws a line per run and matching tag: the per-layer charts now hold exactly L lines, one per layer run; the
    early-exit charts one line per τ, each in a run (a colour) of its own. The chart images are a column wide."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=1, limit_train_batches=1)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    run = Path(logger.log_dir)
    runs = {}
    for folder in [run, *sorted(run.glob("layers/*")), *sorted(run.glob("thresholds/*"))]:
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
        events.Reload()
        runs[folder] = events
    (config,) = runs[run].Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    charts = {chart.title: chart.multiline.tag[0] for category in layout.category for chart in category.chart}
    summary = load_summary(find_summaries(run)[0])
    layers, thresholds = len(summary["layers"]), len(summary["early_exit"])
    per_layer = [title for title in charts if title.endswith("per layer")]
    assert "val accuracy per layer" in per_layer and len(per_layer) >= 4
    for title, pattern in charts.items():
        lines = [
            (folder, tag)
            for folder, events in runs.items()
            for tag in events.Tags()["scalars"]
            if re.fullmatch(pattern, tag)
        ]
        if title in per_layer:
            assert len(lines) == layers, (title, lines)
            assert {folder.name for folder, _ in lines} == {f"layer_{n:02d}" for n in summary["layers"]}, title
        elif title in ("val early-exit accuracy", "val early-exit speedup"):
            assert len(lines) == thresholds and len({folder for folder, _ in lines}) == thresholds, (title, lines)
            assert all(folder.parent.name == "thresholds" for folder, _ in lines), title
    image = runs[run].Images("layerwise val/accuracy per layer")[-1]
    assert image.width == 330, "a column wide at 100 dpi: TensorBoard shows it at its own size"
