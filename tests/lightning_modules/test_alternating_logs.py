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
@pytest.mark.parametrize("every", [2, 3])
def test_both_objectives_have_a_curve_with_any_log_every_n_steps(tmp_path, every):
    """With an even log_every_n_steps every written step is an aligned one: the last-layer loss is still written.

    Each written value is that objective's loss at its latest step up to the written one (an independent record).
    """
    module = RecordingLosses(tiny_backbone(), optimizer=lambda params: torch.optim.SGD(params, lr=0.01))
    logger = CSVLogger(tmp_path, name="run")
    job = trainer(tmp_path, [], max_steps=12, logger=logger, log_every_n_steps=every, limit_val_batches=0)
    job.fit(module, train_loader(128, batch_size=8))
    assert module.objectives == ["last", "aligned"] * 6
    rows = pd.read_csv(f"{logger.log_dir}/metrics.csv").dropna(subset=["train/loss"])
    assert len(rows) == 12 // every
    for key in ("train/loss_last", "train/loss_aligned"):
        assert key in rows and rows[key].notna().all() and (rows[key] > 0).all(), key
    for _, row in rows.iterrows():
        step = int(row["step"])  # 0-based, the step whose metrics were written
        for objective in ("last", "aligned"):
            latest = max(s for s in range(step + 1) if module.objectives[s] == objective)
            assert row[f"train/loss_{objective}"] == pytest.approx(module.losses[latest], rel=1e-6), (step, objective)
