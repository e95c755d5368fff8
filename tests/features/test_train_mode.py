"""Pretrained Hugging Face backbones are fine-tuned with dropout on and validated with it off."""

import lightning.pytorch as pl
import pytest
import torch
from tiny_models import tiny_config
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from layerwise.features import HFCausalLM, HFEncoder
from layerwise.lightning_modules import Standard


class DropoutModes(pl.Callback):
    """Records whether every dropout module of the model is in training mode, per stage."""

    def __init__(self) -> None:
        self.modes: dict[str, set[bool]] = {"train": set(), "val": set()}

    def _record(self, pl_module: pl.LightningModule, stage: str) -> None:
        dropouts = [m for m in pl_module.modules() if isinstance(m, nn.Dropout)]
        assert dropouts, "the test model must have dropout"
        self.modes[stage] |= {m.training for m in dropouts}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._record(pl_module, "train")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._record(pl_module, "val")


def saved_model(tmp_path, kind: str) -> str:
    if kind == "encoder":
        config = tiny_config(
            "bert",
            num_hidden_layers=2,
            hidden_size=16,
            num_attention_heads=2,
            intermediate_size=32,
            vocab_size=50,
            hidden_dropout_prob=0.3,
            num_labels=2,
            max_position_embeddings=512,  # BERT's default, which this test was written with
        )
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        config = tiny_config("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=50, resid_pdrop=0.3, n_positions=1024)
        model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path / kind
    model.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind", ["encoder", "causal_lm"])
def test_pretrained_backbones_train_with_dropout_and_validate_without(tmp_path, kind):
    folder = saved_model(tmp_path, kind)
    backbone = HFEncoder(folder, num_classes=2) if kind == "encoder" else HFCausalLM(folder)
    ids = torch.randint(1, 50, (8, 6), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": ids[i], "attention_mask": torch.ones(6, dtype=torch.long)} for i in range(8)]
    if kind == "encoder":
        rows = [{**row, "labels": torch.tensor(i % 2)} for i, row in enumerate(rows)]
    loader = DataLoader(rows, batch_size=4)
    modes = DropoutModes()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[modes],
        num_sanity_val_steps=0,
    )
    trainer.fit(Standard(backbone), loader, loader)
    assert modes.modes == {"train": {True}, "val": {False}}
