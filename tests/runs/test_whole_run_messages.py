"""What a whole run says to its user: errors in one line naming the cause (a word for a number, checkpointing off
beside a ModelCheckpoint, an empty training text, a warm-up longer than the schedule), non-finite training said, epoch
lines with means, no Lightning table after layerwise's own, and predict naming the logger it does not use."""

import re
from pathlib import Path

import pytest
import torch
from helpers import trainer
from lightning.pytorch import LightningModule
from torch import nn

from layerwise.callbacks.progress import ProgressLines
from layerwise.cli import main
from layerwise.errors import LayerwiseWarning

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs" / "quickstart.yaml")
TINY = [
    "--config",
    QUICKSTART,
    "--model.init_args.backbone.init_args.embed_dim=16",
    "--model.init_args.backbone.init_args.depth=2",
    "--model.init_args.backbone.init_args.num_heads=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
]


def error_line(capsys, command: str = "fit") -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"layerwise {command}: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def run_fails(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_a_word_for_a_number_names_its_option_and_type(tmp_path, capsys):
    run_fails(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}", "--model.init_args.optimizer.init_args.lr=fast"])
    line = error_line(capsys)
    assert "--model.init_args.optimizer.init_args.lr: expected float, got 'fast'" in line, line


def test_checkpointing_off_beside_a_model_checkpoint_is_one_line(tmp_path, capsys):
    run_fails(["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_checkpointing=false"])
    line = error_line(capsys)
    assert "enable_checkpointing=False" in line and "ModelCheckpoint" in line


def test_an_empty_training_text_is_one_line_not_a_traceback(tmp_path, capsys):
    empty = tmp_path / "train.txt"
    empty.write_text("")
    argv = [
        "fit",
        "--config",
        str(REPO / "configs" / "demo" / "shakespeare_gpt_standard.yaml"),
        f"--data.init_args.train_files=[{empty}]",
        "--data.init_args.val_files=null",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
    ]
    run_fails(argv)
    line = error_line(capsys)
    assert "--data.init_args.train_files" in line and "0 tokens" in line


def test_validate_prints_layerwise_s_table_and_not_lightning_s(tmp_path, capsys):
    main(["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    capsys.readouterr()
    main(["validate", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}", f"--ckpt_path={checkpoint}"])
    out = capsys.readouterr().out
    assert "accuracy" in out and "Validate metric" not in out and "│" not in out
    assert out.rstrip().splitlines()[-1].startswith("layerwise validate: checkpoint ")


# every validation sample is NaN: the analysis says so in one line, and torchmetrics' "compute before update" is not
# repeated for every metric that was never updated
@pytest.mark.filterwarnings("error:The ``compute`` method of metric")
def test_non_finite_training_is_said_once_with_its_batch_and_in_the_closing_line(tmp_path, capsys, monkeypatch):
    from layerwise.datamodules.digits import DigitsDataModule

    setup = DigitsDataModule.setup

    def poisoned(self, stage=None):
        setup(self, stage)
        self.train_set.tensors[0][:] = float("nan")

    monkeypatch.setattr(DigitsDataModule, "setup", poisoned)
    with (
        pytest.warns(
            LayerwiseWarning,
            match=r"not finite .* from epoch 0, batch 0 \(step 0\).* in 64 samples.*"
            r"--trainer.detect_anomaly=true",
        ),
        pytest.warns(LayerwiseWarning, match=r"skipped \d+ val samples with non-finite values"),
    ):
        main(["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    closing = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "2 training batches with a non-finite loss (the first: epoch 0, batch 0" in closing, closing


def test_the_epoch_line_shows_epoch_means_under_each_objective(tmp_path, capsys):
    main(["fit", *TINY, "--trainer.limit_train_batches=4", f"--trainer.logger.init_args.save_dir={tmp_path}"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 0 done")]
    assert len(lines) == 1
    means = dict(re.findall(r"(train/\S+) ([\d.]+)", lines[0]))
    assert {"train/loss_aligned", "train/loss_last", "train/acc"} <= set(means), lines[0]  # alternating: both losses


def test_progress_lines_average_the_epoch_not_the_last_batch(tmp_path, capsys):
    class Steps(LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(()))
            self.values = [1.0, 2.0, 6.0]

        def training_step(self, batch, batch_idx):
            loss = self.weight * 0 + self.values[batch_idx]
            self.log("train/acc", torch.tensor(batch_idx / 2))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    data = torch.utils.data.DataLoader(torch.zeros(3, 1), batch_size=1)
    trainer(tmp_path, [ProgressLines()], max_epochs=1).fit(Steps(), data)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "done" in line]
    assert "train/loss 3.0000" in line and "train/acc 0.5000" in line, line  # means of (1, 2, 6) and (0, .5, 1)


def test_predict_says_it_does_not_use_an_explicit_logger(tmp_path, capsys):
    main(["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    capsys.readouterr()
    main(["predict", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path / 'p'}", f"--ckpt_path={checkpoint}"])
    captured = capsys.readouterr()
    assert "layerwise predict: --trainer.logger is not used: predict logs nothing." in captured.err
    assert captured.out.rstrip().splitlines()[-1].startswith("layerwise predict: checkpoint ")
    assert not (tmp_path / "p").exists()


def test_a_warm_up_longer_than_the_schedule_names_both_options(tmp_path, capsys):
    argv = ["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"]
    run_fails([*argv, "--model.init_args.lr_scheduler.init_args.max_epochs=1"])
    line = error_line(capsys)
    assert "lr_scheduler.init_args.warmup_epochs=2" in line and "lr_scheduler.init_args.max_epochs=1" in line, line
