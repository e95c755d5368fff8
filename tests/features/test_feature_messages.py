"""Layer access refuses what it cannot read in one line naming the option: hooked blocks of different widths, a model
of no known family without paths, a block output of another shape; and a first block Jacobian prints no torch noise.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from layerwise.cli import LayerwiseCLI
from layerwise.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
QUIET = [
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_checkpointing=false",
]


def one_line(capsys, exit_info) -> str:
    """Exit code 2, one `error:` line, no traceback."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


class Residual(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.fc = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return self.fc(x) + (x if x.shape[-1] == self.fc.out_features else 0)


class WideningModel(LightningModule):
    """Digits as 8 tokens of width 8 -> blocks of widths 8, 12, 12 -> first token -> LayerNorm -> Linear."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Residual(8, 8), Residual(8, 12), Residual(12, 12)])
        self.norm = nn.LayerNorm(12)
        self.fc = nn.Linear(12, 10)

    def forward(self, images):
        x = images.reshape(len(images), 8, 8)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.norm(x[:, 0]))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val/loss", F.cross_entropy(self(images), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_hooked_blocks_of_different_widths_end_in_one_line_naming_the_option(tmp_path, capsys, monkeypatch):
    args = [
        "validate",
        "--model=test_feature_messages.WideningModel",
        "--data=layerwise.datamodules.DigitsDataModule",
        *QUIET,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=layerwise.callbacks.LayerwiseAnalysis",
        "--trainer.callbacks.blocks=blocks",
        "--trainer.callbacks.final_norm=norm",
        "--trainer.callbacks.classifier=fc",
        "--trainer.callbacks.log_figures=false",
    ]
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert line.startswith("layerwise validate: error: `blocks=blocks`: "), line
    assert "block 1 returns features of width 8, block 2 of width 12" in line, line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match="different widths"):  # a run of its own folder: the first one's config stays
        LayerwiseCLI(args=[*args, f"--trainer.default_root_dir={tmp_path / 'debug'}"])


def test_a_model_outside_the_table_without_paths_ends_in_one_line(tmp_path, capsys):
    args = [
        "validate",
        "--model=test_feature_messages.WideningModel",
        "--data=layerwise.datamodules.DigitsDataModule",
        *QUIET,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=layerwise.callbacks.LayerwiseAnalysis",
        "--trainer.callbacks.log_figures=false",
    ]
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert "layerwise found no model of a known family" in line and "`blocks=" in line, line


def test_the_first_block_jacobian_prints_no_torch_jit_script_deprecation():
    """torch builds its JVP decompositions with its own torch.jit.script on a process's first forward-mode AD."""
    code = (
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "from layerwise.features.jacobian import trace_blocks, diagonal_jacobians\n"
        "blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])\n"
        "def run():\n"
        "    x = torch.randn(1, 3, 4)\n"
        "    for block in blocks:\n"
        "        x = x + block(x)\n"
        "trace = trace_blocks(blocks, run)\n"
        "print('SHAPE', tuple(diagonal_jacobians(blocks, trace).shape))\n"
    )
    result = run_python("-c", code)
    assert "SHAPE (2, 4, 4)" in result.stdout, result.stderr[-3000:]
    assert "jit.script" not in result.stderr, result.stderr[-3000:]


def test_a_block_output_of_another_shape_names_the_option():
    from layerwise.errors import UsageError
    from layerwise.features.pooling import pool_tokens

    with pytest.raises(UsageError, match=r"shape \(2, 3, 4, 5\).*`blocks`"):
        pool_tokens(torch.zeros(2, 3, 4, 5), "cls")


@pytest.mark.filterwarnings("ignore:.*nested tensors is in prototype stage")
def test_a_nested_tensor_block_output_is_read_like_any_other():
    """nn.TransformerEncoder's fast path (enable_nested_tensor=True, its default) hands its layers nested tensors."""
    from layerwise.features.hooks import hooked_blocks
    from layerwise.features.pooling import pool_tokens

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    tokens = torch.randn(3, 5, 8)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    outputs = []
    with torch.no_grad(), hooked_blocks(encoder.layers, on_output=lambda index, out: outputs.append(out)):
        encoder(tokens, src_key_padding_mask=padding)
    assert outputs[0].is_nested  # the case: a block output of its own kind
    for pooling in ("mean", "last", "cls"):
        for mask in (None, (~padding).long()):  # the lengths of its parts, or the batch's mask
            pooled = pool_tokens(outputs[-1], pooling, 0, mask)
            parts = outputs[-1].unbind()
            expected = {
                "mean": [p.mean(0) for p in parts],
                "last": [p[-1] for p in parts],
                "cls": [p[0] for p in parts],
            }
            torch.testing.assert_close(pooled, torch.stack(expected[pooling]))


@pytest.mark.filterwarnings("ignore:.*nested tensors is in prototype stage")
def test_a_users_transformer_encoder_with_nested_tensors_is_analysed(tmp_path):
    """A user's model on nn.TransformerEncoder (enable_nested_tensor=True, its default) through LayerwiseAnalysis's
    hooks: the last layer's shared-head accuracy is the model's own, over every real token of padded batches."""
    import lightning as L
    from helpers import read_summary, trainer
    from torch.utils.data import DataLoader

    from layerwise.callbacks import LayerwiseAnalysis

    class Encoder(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(20, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 3)
            self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

        def forward(self, input_ids, attention_mask):
            h = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
            mask = attention_mask[..., None].float()
            return self.head(self.norm((h * mask).sum(1) / mask.sum(1)))

        def validation_step(self, batch, batch_idx):
            self.predicted.append(self(batch["input_ids"], batch["attention_mask"]).argmax(-1) == batch["labels"])

    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 9, (40,), generator=generator)
    rows = [
        {
            "input_ids": torch.randint(0, 20, (8,), generator=generator),
            "attention_mask": (torch.arange(8) < length).long(),
            "labels": torch.randint(0, 4, (), generator=generator),
        }
        for length in lengths
    ]
    model = Encoder()
    model.predicted = []
    callback = LayerwiseAnalysis(
        blocks="encoder.layers", final_norm="norm", classifier="head", pooling="mean", log_figures=False
    )
    trainer(tmp_path, [callback]).validate(model, DataLoader(rows, batch_size=16), verbose=False)
    summary = read_summary(tmp_path)
    assert summary["num_samples"] == 40 and summary["layers"] == [1, 2, 3]
    assert summary["accuracy"][-1] == pytest.approx(torch.cat(model.predicted).double().mean().item(), abs=1e-12)
