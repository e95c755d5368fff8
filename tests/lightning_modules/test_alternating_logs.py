"""Alternating training shows both of its objectives in the logs, whatever `log_every_n_steps` is."""

import pandas as pd
import pytest
import torch
from helpers import TRAINING_ONLY, RecordingAlternating, tiny_backbone, train_loader, trainer
from lightning.pytorch.loggers import CSVLogger


class RecordingLosses(RecordingAlternating):
    """Also records every step's loss, to compare with what the logger wrote."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []

    def compute_loss(self, outputs):
        loss = super().compute_loss(outputs)
        self.losses.append(loss.item())
        return loss


@TRAINING_ONLY
@pytest.mark.parametrize("every", [2, 3, 10])
def test_both_objectives_have_a_curve_with_any_log_every_n_steps(tmp_path, every):
    """With an even log_every_n_steps every written step is an aligned one: both objectives are still curves.

    Each written value is the mean of that objective's losses over the steps since the previous write, from an
    independent record of every step's loss (a written step's own value would alias to one objective at even N).
    """
    module = RecordingLosses(tiny_backbone(), optimizer=lambda params: torch.optim.SGD(params, lr=0.01))
    logger = CSVLogger(tmp_path, name="run")
    steps = 4 * every if every < 10 else 2 * every
    job = trainer(tmp_path, [], max_steps=steps, logger=logger, log_every_n_steps=every, limit_val_batches=0)
    job.fit(module, train_loader(8 * steps, batch_size=8))
    assert module.objectives == ["last", "aligned"] * (steps // 2)
    rows = pd.read_csv(f"{logger.log_dir}/metrics.csv").dropna(subset=["train/loss"])
    assert list(rows["step"]) == list(range(every - 1, steps, every))  # the written steps, 0-based
    losses = torch.tensor(module.losses, dtype=torch.float64)
    for _, row in rows.iterrows():
        step = int(row["step"])
        window = range(step - every + 1, step + 1)
        for objective in ("last", "aligned"):
            mine = [s for s in window if module.objectives[s] == objective]
            assert mine, (step, objective)  # a window of N >= 2 steps holds both objectives
            expected = losses[mine].mean().item()
            assert row[f"train/loss_{objective}"] == pytest.approx(expected, rel=1e-5), (step, objective)
        if every % 2 == 0:  # the step's own loss is the aligned one: the reason for the windows
            assert row["train/loss"] == pytest.approx(module.losses[step], rel=1e-6)
            assert module.objectives[step] == "aligned"
