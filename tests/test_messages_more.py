"""Issue 23: the package's own checks end a `layerwise` command in one `error:` line (exit 2), the traceback only with
LAYERWISE_DEBUG=1 — a GLUE file with a bad label, a header only, the wrong columns or nothing at all, and a model
whose hooked blocks have different widths (point 2); and the console of a fit without upstream noise (point 15)."""

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from layerwise.cli import LayerwiseCLI
from layerwise.errors import UsageError

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

GLUE_CONFIG = """\
seed_everything: 0
trainer:
  logger: false
model:
  class_path: layerwise.lightning_modules.Standard
  init_args:
    backbone:
      class_path: layerwise.features.HFEncoder
      init_args:
        model_type: bert
        num_classes: 2
        config_overrides: {hidden_size: 16, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 32,
                           vocab_size: 300}
data:
  class_path: layerwise.datamodules.GLUEDataModule
  init_args:
    task: sst2
    tokenizer: byte
    max_length: 16
    batch_size: 2
"""

DEV = "sentence\tlabel\na good film\t1\na bad film\t0\n"


def one_line(capsys, exit_info) -> str:
    """Exit code 2, one `error:` line, no traceback."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def glue_fit(tmp_path, train: str) -> list[str]:
    """The arguments of a tiny BERT fit on an SST-2 folder whose train.tsv is ``train``."""
    folder = tmp_path / "sst2"
    folder.mkdir(exist_ok=True)
    (folder / "train.tsv").write_text(train, encoding="utf-8")
    (folder / "dev.tsv").write_text(DEV, encoding="utf-8")
    (tmp_path / "glue.yaml").write_text(GLUE_CONFIG)
    return [
        "fit",
        "--config",
        str(tmp_path / "glue.yaml"),
        *QUIET,
        f"--data.init_args.data_dir={folder}",
        f"--data.init_args.tokenizer_dir={tmp_path / 'tok'}",
        f"--trainer.default_root_dir={tmp_path}",
    ]


@pytest.mark.parametrize(
    ("train", "cause"),
    [
        ("sentence\tlabel\na good film\t1\na bad film\tmaybe\n", "train.tsv, row 2: unknown sst2 label 'maybe'"),
        ("sentence\tlabel\n", "train.tsv has a header but no rows"),
        ("text\tlabel\na good film\t1\n", "train.tsv lacks the sst2 text column(s)"),
        ("", "train.tsv is empty"),
    ],
    ids=["bad-label", "header-only", "wrong-columns", "empty"],
)
def test_a_bad_glue_file_ends_in_one_line_naming_the_file_and_the_option(tmp_path, capsys, monkeypatch, train, cause):
    args = glue_fit(tmp_path, train)
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert line.startswith(f"layerwise fit: error: `--data.init_args.data_dir={tmp_path / 'sst2'}`: "), line
    assert cause in line, line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match=cause.replace("(", r"\(").replace(")", r"\)")):
        LayerwiseCLI(args=args)


# ------------------------------------------------------------------------------ hooked blocks of different widths


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
        "--model=test_messages_more.WideningModel",
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
    with pytest.raises(UsageError, match="different widths"):
        LayerwiseCLI(args=args)
