"""NaN inputs: the analysis and its figures finish (a note where nothing finite is left); a NaN loss warned once."""

import json
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
from helpers import TRAINING_ONLY, digits, fitted_module, summary_file, trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from layerwise.callbacks import LayerwiseAnalysis, ResidualNormRatioMonitor
from layerwise.figures.plot import plot_summary
from layerwise.figures.residual import norm_ratio_figure
from layerwise.figures.summary import summary_figures


def nan_loader(num_samples: int = 48, first_bad: int = 0) -> DataLoader:
    """Digits whose images from ``first_bad`` on are all NaN."""
    x, y, _, _ = digits()
    x = x[:num_samples].clone()
    x[first_bad:] = float("nan")
    return DataLoader(TensorDataset(x, y[:num_samples]), batch_size=16)


def notes(figure) -> list[str]:
    return [text.get_text() for ax in figure.axes for text in ax.texts]


def test_nan_inputs_end_in_a_summary_and_figures_with_a_note(tmp_path):
    """All-NaN features used to end the run inside matplotlib (log axis of no positive value)."""
    callbacks = [LayerwiseAnalysis(), ResidualNormRatioMonitor()]
    job = trainer(tmp_path, callbacks, logger=TensorBoardLogger(tmp_path, name="run"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the analysis' own "skipped N samples" warning is tested elsewhere
        job.validate(fitted_module(), nan_loader(), verbose=False)
    path = summary_file(job.log_dir)
    summary = json.loads(path.read_text())
    assert summary["n_nonfinite"] == 48
    figures = summary_figures(summary)
    assert "no finite positive ratios to draw" in notes(figures["residual_norm_ratio"])
    assert "no finite COS values to draw" in notes(figures["cos"])
    for figure in figures.values():
        figure.canvas.draw()  # every figure renders
        plt.close(figure)
    written = plot_summary(path, tmp_path / "figures", ("png",))
    assert {p.name.rsplit("_", 1)[0] for p in written} >= {path.stem + "_residual_norm", path.stem + "_cos"}


def test_a_residual_figure_with_finite_values_keeps_its_log_axis():
    results = {
        "layers": [1, 2],
        "quantile_levels": [0.25, 0.5, 0.75],
        "branches": ["block"],
        "quantiles": [[[1.0, 2.0, 3.0], [None, None, None]]],
        "mean": [[2.0, None]],
        "token": "last",
    }
    figure = norm_ratio_figure(results)
    assert figure.axes[0].get_yscale() == "log" and not notes(figure)
    figure.canvas.draw()
    plt.close(figure)


@TRAINING_ONLY
def test_a_nan_training_loss_is_warned_once_with_its_step(tmp_path):
    module = fitted_module()
    module.optimizer_factory = lambda params: torch.optim.SGD(params, lr=0.0)  # the weights stay finite
    job = trainer(tmp_path, [], max_steps=3, limit_val_batches=0, log_every_n_steps=1)
    with pytest.warns(UserWarning, match="training loss") as caught:
        job.fit(module, nan_loader(48, first_bad=16))  # batch 0 finite, batches 1 and 2 NaN
    messages = [str(w.message) for w in caught if "training loss" in str(w.message)]
    assert messages == [
        "Standard: the training loss is not finite (NaN/inf) from epoch 0, batch 1 (step 1), whose features are "
        "non-finite in 16 samples; the run goes on (once NaN reaches the weights, every later value is NaN): "
        "`--trainer.detect_anomaly=true` stops it at the first non-finite gradient. Check the inputs for NaN/inf, or "
        "lower the learning rate."
    ]
    assert module.nonfinite_training() == (
        "2 training batches with a non-finite loss (the first: epoch 0, batch 1, step 1, 16 samples with non-finite "
        "features)"
    )


def test_empty_data_draws_a_note_not_an_error():
    figure = summary_figures({"layers": [], "cos": []})["cos"]
    figure.canvas.draw()
    assert notes(figure) == ["no finite COS values to draw"]
    plt.close(figure)
