"""``layerwise fit`` with every logger a user configures, to its last line: where things land, at which step.

The real entry point in a fresh process, on the shipped quickstart config cut to 2 epochs of 2 batches, with
TensorBoard (the config as shipped), CSV, W&B offline, MLflow on SQLite (refused alone: it gives the run no folder;
accepted second), no logger, and two loggers at once. Each run ends with rc 0 and one closing line that names where
the figures went; the summaries are in the first logger's folder, as README says; and every validation is one step
everywhere it is read: the JSON summary's ``global_step``, the TensorBoard/CSV/MLflow scalars and the images.
"""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_launchers import QUICKSTART, TIMEOUT_S, check_finished, environment

CUT = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2"]  # figures at the last validation (every 10th)
TENSORBOARD = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}}
CSV = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs", "name": "csv"}}
WANDB = {
    "class_path": "lightning.pytorch.loggers.WandbLogger",
    "init_args": {"project": "matrix", "save_dir": "runs", "offline": True},
}
MLFLOW = {
    "class_path": "lightning.pytorch.loggers.MLFlowLogger",
    "init_args": {
        "experiment_name": "matrix",
        "tracking_uri": "sqlite:///runs/mlflow.db",
        "artifact_location": "runs/mlartifacts",
    },
}

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="launches processes as on a Linux node")


def fit(cwd: Path, loggers) -> subprocess.CompletedProcess:
    """``layerwise fit`` of the cut quickstart in ``cwd`` with ``loggers`` (None: the config's TensorBoard)."""
    (cwd / "runs").mkdir(parents=True)
    arguments = ["fit", "--config", str(QUICKSTART), *CUT]
    if loggers is not None:
        overlay = cwd / "logger.yaml"
        overlay.write_text(json.dumps({"trainer": {"logger": loggers}}))  # JSON is YAML
        arguments += ["--config", str(overlay)]
    entry = [str(Path(sys.executable).with_name("layerwise")), *arguments]
    return subprocess.run(entry, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)


def summary_steps(folder: Path) -> list[int]:
    """The ``global_step`` of every validation summary in ``folder/layerwise``."""
    paths = sorted((folder / "layerwise").glob("val_epoch_*_step_*.json"))
    return sorted(json.loads(path.read_text())["global_step"] for path in paths)


def tensorboard_steps(folder: Path) -> tuple[set[int], set[int]]:
    """The steps of TensorBoard's ``val/`` scalars and of its images."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    scalars = {event.step for tag in tags["scalars"] if tag.startswith("val/") for event in events.Scalars(tag)}
    images = {event.step for tag in tags["images"] for event in events.Images(tag)}
    return scalars, images


def png_steps(folder: Path) -> set[int]:
    """The steps in the names of the PNG figures under ``folder/layerwise/images``."""
    return {int(re.search(r"_step_(\d{7})", path.name).group(1)) for path in folder.rglob("images/**/*.png")}


def closing(process: subprocess.CompletedProcess) -> str:
    return check_finished([process], "fit")


def test_tensorboard_as_shipped(tmp_path):
    line = closing(fit(tmp_path, None))
    run = tmp_path / "runs" / "quickstart" / "version_0"
    steps = summary_steps(run)
    assert len(steps) == 2, steps
    scalars, images = tensorboard_steps(run)
    assert scalars == set(steps) and images == {steps[-1]}, (scalars, images, steps)  # one validation, one step
    assert f"figures in TensorBoard ({Path('runs/quickstart/version_0')})" in line


@pytest.mark.slow
def test_csv(tmp_path):
    line = closing(fit(tmp_path, CSV))
    run = tmp_path / "runs" / "csv" / "version_0"
    steps = summary_steps(run)
    assert len(steps) == 2
    with open(run / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/acc")]
    assert {int(row["step"]) for row in rows} == set(steps) and png_steps(run) == {steps[-1]}
    assert "figures in PNG files in" in line


@pytest.mark.slow
def test_no_logger(tmp_path):
    line = closing(fit(tmp_path, False))
    steps = summary_steps(tmp_path)  # the working folder, Lightning's default_root_dir
    assert len(steps) == 2 and png_steps(tmp_path) == {steps[-1]}
    assert "PNG files in" in line


@pytest.mark.slow
def test_wandb_offline(tmp_path):
    pytest.importorskip("wandb", reason="wandb is absent (pip install -e '.[loggers]')")
    line = closing(fit(tmp_path, WANDB))
    steps = summary_steps(tmp_path / "runs")  # W&B first: its save_dir is the run folder
    assert len(steps) == 2
    (run,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    assert list((run / "files" / "media" / "images").rglob("*.png")), "no figure reached W&B"
    assert "figures in W&B" in line


@pytest.mark.slow
def test_mlflow_alone_is_refused_before_any_work(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    process = fit(tmp_path, MLFLOW)
    assert process.returncode == 2, process.stderr[-3000:]
    errors = [line for line in process.stderr.splitlines() if line.startswith("layerwise fit: error:")]
    assert len(errors) == 1 and "--trainer.logger" in errors[0], process.stderr[-3000:]
    assert not list(tmp_path.rglob("*.json")), "a refused run wrote results"


@pytest.mark.slow
def test_tensorboard_and_mlflow_at_once(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    from mlflow import MlflowClient

    line = closing(fit(tmp_path, [TENSORBOARD, MLFLOW]))
    run = tmp_path / "runs" / "quickstart" / "version_0"  # the init_args merge with the config's TensorBoardLogger
    steps = summary_steps(run)
    assert len(steps) == 2
    scalars, images = tensorboard_steps(run)
    assert scalars == set(steps) and images == {steps[-1]}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "matrix"]
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(mlflow_run.info.run_id, "val/acc")
    assert {metric.step for metric in history} == set(steps)
    artifacts = client.list_artifacts(mlflow_run.info.run_id, "images")
    assert artifacts, "no figure reached MLflow"
    assert "TensorBoard" in line and "MLflow" in line
