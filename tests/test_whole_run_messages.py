"""What a whole run says to its user (issue 35): errors in one line naming the cause, non-finite training said,
epoch lines with means, a user's own MLP analysed, and no Lightning table after layerwise's own."""

import re
from pathlib import Path

import pytest
import torch
from helpers import read_summary, trainer, val_loader
from lightning.pytorch import LightningModule
from torch import nn

from layerwise.callbacks import LayerwiseAnalysis
from layerwise.callbacks.progress import ProgressLines
from layerwise.cli import main
from layerwise.errors import LayerwiseWarning

REPO = Path(__file__).resolve().parents[1]
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


class Block(nn.Module):
    """x + MLP(LN(x)) on (B, d): the residual stream after the block is its output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class ResidualMLP(nn.Module):
    """A user's own model: residual MLP blocks on (B, d) features, no token axis."""

    def __init__(self, width: int = 16, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.flatten(1))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class UserModule(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = ResidualMLP()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


def test_a_users_mlp_with_block_outputs_of_one_token_is_analysed(tmp_path):
    callback = LayerwiseAnalysis(blocks="net.blocks", final_norm="net.norm", classifier="net.head", log_figures=False)
    module = UserModule()
    trainer(tmp_path, [callback]).validate(module, val_loader(101), verbose=False)
    summary = read_summary(tmp_path)
    assert summary["num_samples"] == 101 and summary["depth"] == 3
    x, y = val_loader(101).dataset.tensors
    with torch.no_grad():  # an independent reference: layer 3's prediction through the model's own norm and head
        h = module.net.embed(x.flatten(1))
        for block in module.net.blocks:
            h = h + block.mlp(h)
        accuracy = (module.net.head(module.net.norm(h)).argmax(-1) == y).double().mean().item()
    assert summary["accuracy"][-1] == pytest.approx(accuracy, abs=1e-12)


def test_a_block_output_of_another_shape_names_the_option():
    from layerwise.errors import UsageError
    from layerwise.features.pooling import pool_tokens

    with pytest.raises(UsageError, match=r"shape \(2, 3, 4, 5\).*`blocks`"):
        pool_tokens(torch.zeros(2, 3, 4, 5), "cls")


def test_a_model_summary_given_through_trainer_defaults_stays(tmp_path):
    from lightning.pytorch.callbacks import ModelSummary

    from layerwise.cli import LayerwiseCLI
    from layerwise.cli.summary import CountedModelSummary

    mine = ModelSummary(max_depth=3)
    argv = ["--config", QUICKSTART, f"--trainer.default_root_dir={tmp_path}"]
    cli = LayerwiseCLI(args=argv, run=False, trainer_defaults={"callbacks": [mine]})
    assert mine in cli.trainer.callbacks
    assert not any(isinstance(c, CountedModelSummary) for c in cli.trainer.callbacks)
    plain = LayerwiseCLI(args=argv, run=False)  # without one: Lightning's default becomes the counted summary
    assert any(isinstance(c, CountedModelSummary) for c in plain.trainer.callbacks)


def test_predict_says_it_does_not_use_an_explicit_logger(tmp_path, capsys):
    main(["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    capsys.readouterr()
    main(["predict", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path / 'p'}", f"--ckpt_path={checkpoint}"])
    captured = capsys.readouterr()
    assert "layerwise predict: --trainer.logger is not used: predict logs nothing." in captured.err
    assert captured.out.rstrip().splitlines()[-1].startswith("layerwise predict: checkpoint ")
    assert not (tmp_path / "p").exists()


def test_threads_sets_torch_and_keeps_lightnings_ddp_launcher_from_resetting_them(tmp_path, monkeypatch):
    from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

    from layerwise.cli import LayerwiseCLI

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        LayerwiseCLI(args=["--config", QUICKSTART, f"--trainer.default_root_dir={tmp_path}", "--threads=1"], run=False)
        assert torch.get_num_threads() == 1
        _set_num_threads_if_needed(num_processes=1)  # what Lightning's DDP launchers call before they start ranks
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_warm_up_longer_than_the_schedule_names_both_options(tmp_path, capsys):
    argv = ["fit", *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"]
    run_fails([*argv, "--model.init_args.lr_scheduler.init_args.max_epochs=1"])
    line = error_line(capsys)
    assert "lr_scheduler.init_args.warmup_epochs=2" in line and "lr_scheduler.init_args.max_epochs=1" in line, line
