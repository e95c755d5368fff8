"""Figures drawn off the training loop (callbacks/_drawing.py) are all in the event file when the run returns.

Also when the run stops early at ``max_steps`` or dies of an exception in training: the figures already enqueued
are drawn and logged before Lightning closes the logger, and nothing hangs. The images are those ``add_figure``
would have logged: the same figures, rendered with Agg at their dpi, at the step of the results they show.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import fitted_module, train_loader, trainer, val_loader
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from layerwise.callbacks import LayerwiseAnalysis, _drawing
from layerwise.figures import worker
from layerwise.figures.summary import summary_figures
from layerwise.results import find_summaries, load_summary

N = 48


def images(log_dir: str) -> dict[str, list[int]]:
    events = EventAccumulator(log_dir, size_guidance={"images": 0})
    events.Reload()
    return {tag: sorted(event.step for event in events.Images(tag)) for tag in events.Tags()["images"]}


def validation_steps(log_dir: str) -> list[int]:
    summaries = find_summaries(Path(log_dir), all_epochs=True, stage="val")
    return sorted(load_summary(path)["global_step"] for path in summaries)


@pytest.mark.parametrize("where", ["auto", "thread"])
def test_every_epoch_has_all_its_figures_when_fit_returns(tmp_path, monkeypatch, where):
    monkeypatch.setenv("LAYERWISE_FIGURES", where)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=3, limit_train_batches=2)
    before = dict(_drawing.drawn)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    # every epoch's figures drawn one way: in the drawing process (auto, on the CPU too), or all in the thread; two
    # jobs per epoch: the summary's figures and TensorBoard's per-layer chart images
    drawn = {way: _drawing.drawn[way] - before[way] for way in before}
    assert drawn == ({"process": 6, "thread": 0} if where == "auto" else {"process": 0, "thread": 6})
    logged = {tag: at for tag, at in images(logger.log_dir).items() if not tag.startswith("layerwise ")}
    steps = validation_steps(logger.log_dir)
    assert len(steps) == 3
    expected = summary_figures(load_summary(find_summaries(Path(logger.log_dir), stage="val")[-1]))
    assert {tag.split("/", 1)[1] for tag in logged} >= {"cos", "cka", "saturation", "early_exit"}
    for tag, drawn_at in logged.items():
        assert drawn_at == steps, f"{tag}: drawn at {drawn_at}, validations at {steps}"
    assert set(expected) >= {tag.split("/", 1)[1] for tag in logged}


def test_an_image_is_what_add_figure_would_log(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=1, limit_train_batches=1)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    (event,) = events.Images("val/cos")
    import io

    from PIL import Image

    logged = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
    figure = summary_figures(load_summary(find_summaries(Path(logger.log_dir), stage="val")[-1]))["cos"]
    assert logged.shape == worker.rendered(figure).shape
    assert np.abs(logged.astype(int) - worker.rendered(figure).astype(int)).mean() < 1.0


@pytest.mark.parametrize("where", ["thread", "process"])
def test_a_fit_stopped_by_max_steps_keeps_every_figure(tmp_path, monkeypatch, where):
    monkeypatch.setenv("LAYERWISE_FIGURES", where)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(
        tmp_path,
        [LayerwiseAnalysis()],
        logger=logger,
        max_steps=3,
        limit_train_batches=2,
        val_check_interval=1,
        check_val_every_n_epoch=None,
    )
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    steps = validation_steps(logger.log_dir)
    assert steps
    for tag, drawn_at in images(logger.log_dir).items():
        assert drawn_at == steps, tag


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("where", ["thread", "process"])
def test_an_exception_in_training_keeps_the_figures_already_enqueued_and_does_not_hang(tmp_path, monkeypatch, where):
    monkeypatch.setenv("LAYERWISE_FIGURES", where)
    module = fitted_module()
    original = module.training_step

    def failing(batch, batch_idx):
        if module.current_epoch == 1:
            raise _Boom("training failed")
        return original(batch, batch_idx)

    module.training_step = failing
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=3, limit_train_batches=2)
    with pytest.raises(_Boom):
        fit.fit(module, train_loader(), val_loader(N))
    steps = validation_steps(logger.log_dir)
    assert len(steps) == 1
    logged = images(logger.log_dir)
    assert logged and all(drawn_at == steps for drawn_at in logged.values())


def test_a_figure_that_fails_to_draw_is_skipped_with_a_warning_and_the_queue_keeps_going():
    from layerwise.callbacks._loggers import ImageSink
    from layerwise.figures.style import new_figure

    tags = []

    def log(tag, image, step):
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        tags.append((tag, step))

    sink = [ImageSink("test", log)]

    def broken():
        raise ValueError("no data")

    with pytest.warns(UserWarning, match="could not be drawn"):
        _drawing.draw_later(sink, 1, broken)
        _drawing.draw_later(sink, 2, lambda: {"val/ok": new_figure(2, 2)[0]})
        _drawing.wait_for_figures()
    assert tags == [("val/ok", 2)]
    assert torch.is_tensor(torch.zeros(1))  # the worker left torch usable in this thread


def test_the_drawing_thread_outlives_a_warning_made_an_error(capfd):
    """Under ``-W error`` the skip's warning raises in the thread: it is printed, and the thread draws the next job
    (a dead thread left ``wait_for_figures`` waiting for ever on a job nobody would take)."""
    import warnings

    from layerwise.callbacks._loggers import ImageSink
    from layerwise.figures.style import new_figure

    tags = []
    sink = [ImageSink("test", lambda tag, image, step: tags.append(tag))]

    def broken():
        raise ValueError("no data")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _drawing.draw_later(sink, 1, broken, in_process=False)
        _drawing.wait_for_figures()
        alive = _drawing._thread
        _drawing.draw_later(sink, 2, lambda: {"val/ok": new_figure(2, 2)[0]}, in_process=False)
        _drawing.wait_for_figures()
    assert tags == ["val/ok"] and _drawing._thread is alive and alive.is_alive()
    assert "LayerwiseWarning: layerwise: a figure could not be drawn and was skipped (ValueError: no data)" in (
        capfd.readouterr().err
    )


def _figures_that_say_where(path: str) -> dict:
    """A figure job's function: writes the id of the process that builds the figures."""
    import os

    from layerwise.figures.style import new_figure

    Path(path).write_text(str(os.getpid()))
    return {"val/where": new_figure(2, 2)[0]}


class _PlainOwner:
    """An owner of a figure method with plain settings only, which is what travels to the drawing process."""

    def __init__(self):
        self.title, self.layers = "plain", [1, 2]

    def figures(self, results):
        from layerwise.figures.style import new_figure

        figure, axes = new_figure(2, 2)
        axes.set_title(f"{self.title} {self.layers} {results}")
        return {"val/owned": figure}


def _owned_figures(owner, results):
    return owner.figures(results)


def _reads_a_tensor(owner, results):
    from layerwise.figures.style import new_figure

    figure, axes = new_figure(2, 2)
    axes.plot(owner.weights.numpy())  # a plain owner has no `weights`: AttributeError in the drawing process
    return {"val/tensor": figure}


def test_figure_jobs_are_built_and_rendered_in_the_drawing_process_not_the_training_process(tmp_path):
    """The GIL stays with the training loop: a FigureJob's figures are built in another process (its pid is not
    ours), a plain owner of a figure method travels with them, and the images reach the sinks in order."""
    import os

    from layerwise.callbacks._loggers import ImageSink

    logged = []
    sink = [ImageSink("test", lambda tag, image, step: logged.append((tag, step, image.shape)))]
    where = tmp_path / "pid"
    _drawing.draw_later(sink, 4, _drawing.FigureJob(_figures_that_say_where, (str(where),)))
    owner = _PlainOwner()
    _drawing.draw_later(sink, 5, _drawing.FigureJob(_owned_figures, (owner, {"acc": [0.5]})))
    _drawing.wait_for_figures()
    assert int(where.read_text()) != os.getpid()
    assert [(tag, step) for tag, step, _ in logged] == [("val/where", 4), ("val/owned", 5)]
    assert all(len(shape) == 3 and shape[2] == 3 for _, _, shape in logged)


def test_the_figures_of_an_analysis_callback_are_drawn_in_the_drawing_process(tmp_path, monkeypatch):
    """AnalysisCallback's figures (here the residual norm ratio) travel as a plain copy of the callback."""
    from layerwise.callbacks import ResidualNormRatioMonitor

    monkeypatch.setenv("LAYERWISE_FIGURES", "process")

    before = dict(_drawing.drawn)
    trainer(tmp_path, [ResidualNormRatioMonitor()]).validate(fitted_module(), val_loader(16), verbose=False)
    assert _drawing.drawn["process"] - before["process"] == 1 and _drawing.drawn["thread"] == before["thread"]
    assert list(tmp_path.rglob("residual_norm_ratio*.png"))


def test_figures_are_drawn_in_the_process_on_every_device_unless_layerwise_figures_says(tmp_path, monkeypatch):
    """A run draws in the drawing process whatever it trains on (a drawing thread stalls a CPU loop too:
    benchmarks/RESULTS.md, callback_overhead.py); LAYERWISE_FIGURES=thread draws in the thread; anything but
    process/thread/auto is refused by name."""
    import os
    from types import SimpleNamespace

    from layerwise.callbacks import _output

    monkeypatch.delenv("LAYERWISE_FIGURES", raising=False)
    assert _drawing.figures_in_process()
    monkeypatch.setenv("LAYERWISE_FIGURES", "thread")
    assert not _drawing.figures_in_process()
    monkeypatch.setenv("LAYERWISE_FIGURES", "process")
    assert _drawing.figures_in_process()
    monkeypatch.setenv("LAYERWISE_FIGURES", "gpu")
    with pytest.raises(ValueError, match="LAYERWISE_FIGURES='gpu' must be 'process', 'thread' or 'auto'"):
        _drawing.figures_in_process()

    def run(device: str, choice: str) -> int:
        """The pid that drew a figure logged by a trainer training on ``device`` under LAYERWISE_FIGURES=choice."""
        monkeypatch.setenv("LAYERWISE_FIGURES", choice)
        where = tmp_path / f"pid_{device}_{choice}"
        trainer = SimpleNamespace(
            loggers=[],
            log_dir=str(tmp_path / device),
            default_root_dir=str(tmp_path),
            current_epoch=0,
            global_step=1,
            strategy=SimpleNamespace(root_device=torch.device(device)),
        )
        _output.log_figures_later(trainer, _drawing.FigureJob(_figures_that_say_where, (str(where),)))
        _drawing.wait_for_figures()
        return int(where.read_text())

    assert run("cuda", "auto") != os.getpid() and run("cpu", "auto") != os.getpid()  # no GPU needed
    assert run("cpu", "thread") == os.getpid()


def test_a_job_that_cannot_travel_or_fails_there_is_drawn_in_the_thread_and_still_logged(tmp_path):
    """A function the drawing process cannot import (a lambda, a script's __main__) is drawn in the thread; one that
    fails there (it reads a tensor that its plain owner does not have) is drawn in the thread from the original objects
    (``here``); each with one warning that says why."""
    from layerwise.callbacks._loggers import ImageSink
    from layerwise.figures.style import new_figure

    logged = []
    sink = [ImageSink("test", lambda tag, image, step: logged.append(tag))]
    with pytest.warns(UserWarning, match="cannot travel to the drawing process .*lambda"):
        _drawing.draw_later(sink, 1, _drawing.FigureJob(lambda: {"val/lambda": new_figure(2, 2)[0]}))
        _drawing.wait_for_figures()
    original = _PlainOwner()
    job = _drawing.FigureJob(
        _reads_a_tensor,
        (original, None),
        here=lambda: {"val/tensor": new_figure(2, 2)[0]},
    )
    with pytest.warns(UserWarning, match="failed in the drawing process .*AttributeError.*weights"):
        _drawing.draw_later(sink, 2, job)
        _drawing.wait_for_figures()
    assert logged == ["val/lambda", "val/tensor"]


def test_a_figure_logged_in_training_is_the_one_plot_draws_from_the_summary_pixel_for_pixel(tmp_path):
    """One table from results to figures: the drawing process gets the JSON the callbacks wrote and draws it with
    summary_figures, the function `layerwise plot` draws the summary file with (which saves it at 150 dpi)."""
    import io

    from PIL import Image

    from layerwise.callbacks import ResidualNormRatioMonitor

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callbacks = [LayerwiseAnalysis(), ResidualNormRatioMonitor()]
    trainer(tmp_path, callbacks, logger=logger, max_epochs=1, limit_train_batches=1).fit(
        fitted_module(), train_loader(), val_loader(N)
    )
    summary = load_summary(find_summaries(Path(logger.log_dir), stage="val")[-1])
    expected = summary_figures(summary)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    logged = [tag for tag in events.Tags()["images"] if tag.startswith("val/")]
    assert {"val/cos", "val/cka", "val/similarity_accuracy", "val/residual_norm_ratio"} <= set(logged)
    for tag in logged:
        (event,) = events.Images(tag)
        image = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
        assert np.array_equal(image, worker.rendered(expected[tag.split("/", 1)[1]])), tag


def test_the_drawing_process_imports_no_torch_lightning_or_torchmetrics(tmp_path):
    """The worker as the training process starts it, fed a real job: only numpy and matplotlib come in."""
    import pickle
    import subprocess
    import sys

    from layerwise.figures.summary import evaluation_figures

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)], logger=logger, max_epochs=1, limit_train_batches=1).fit(
        fitted_module(), train_loader(), val_loader(N)
    )
    summary = load_summary(find_summaries(Path(logger.log_dir), stage="val")[-1])
    job = pickle.dumps(worker.FigureJob(evaluation_figures, ("val", summary)))
    frame = len(job).to_bytes(8, "little") + job
    script = (
        "import sys\n"
        "from layerwise.figures.worker import serve\n"
        "serve()\n"
        "heavy = [name for name in ('torch', 'lightning', 'torchmetrics') if name in sys.modules]\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], input=frame, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    reply = pickle.loads(result.stdout[8:])
    assert {tag for tag, _ in reply} >= {"val/cos", "val/cka"} and all(not isinstance(i, str) for _, i in reply)
    assert result.stderr.decode().endswith("HEAVY="), result.stderr.decode()[-500:]
