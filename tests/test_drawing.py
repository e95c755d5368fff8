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


def test_every_epoch_has_all_its_figures_when_fit_returns(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=3, limit_train_batches=2)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    logged = images(logger.log_dir)
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
    assert logged.shape == _drawing.rendered(figure).shape
    assert np.abs(logged.astype(int) - _drawing.rendered(figure).astype(int)).mean() < 1.0


def test_a_fit_stopped_by_max_steps_keeps_every_figure(tmp_path):
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


def test_an_exception_in_training_keeps_the_figures_already_enqueued_and_does_not_hang(tmp_path):
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
