"""Every mistake with a checkpoint answered at its cause: truncated files, sharded (FSDP2) folders."""

from pathlib import Path

import pytest
from helpers import fitted_module, trainer, val_loader

from layerwise.cli import LayerwiseCLI
from layerwise.engines.checkpoint import load_module

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
TRUNCATED = r"is truncated \([\d,]+ bytes, the end of the archive is missing\): the copy or the save was cut short"


def saved_checkpoint(tmp_path: Path) -> Path:
    """A real Lightning checkpoint of the tiny fitted module, as `layerwise fit` writes one."""
    job = trainer(tmp_path / "save", [], max_steps=0)
    job.strategy.connect(fitted_module())
    path = tmp_path / "whole.ckpt"
    job.save_checkpoint(path)
    return path


@pytest.fixture
def truncated(tmp_path) -> Path:
    whole = saved_checkpoint(tmp_path)
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # a copy cut short
    return path


def test_a_truncated_checkpoint_is_named_as_truncated_by_the_loader(truncated):
    with pytest.raises(ValueError, match=rf"`--checkpoint={truncated}` {TRUNCATED}"):
        load_module(truncated)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_truncated_ckpt_path_is_named_before_lightning_reads_it(tmp_path, truncated, stage):
    """Lightning's own restore (`--ckpt_path`) goes through the module's reader: no `OSError: [Errno 22]`."""
    job = trainer(tmp_path / "run", [])
    with pytest.raises(ValueError, match=rf"`--ckpt_path={truncated}` {TRUNCATED}"):
        getattr(job, stage)(fitted_module(), val_loader(), ckpt_path=truncated)


def test_a_foreign_file_is_not_a_pytorch_checkpoint(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint")
    message = rf"`--ckpt_path={path}` is not a PyTorch checkpoint \(neither a torch.save archive nor a pickle\)\.$"
    with pytest.raises(ValueError, match=message):
        trainer(tmp_path / "run", []).validate(fitted_module(), val_loader(), ckpt_path=path)


def test_the_cli_answers_a_truncated_ckpt_path_in_one_line(tmp_path, truncated, capsys):
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(
            args=[
                "validate",
                "--config",
                QUICKSTART,
                f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
                "--trainer.enable_progress_bar=false",
                f"--ckpt_path={truncated}",
            ]
        )
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"`--ckpt_path={truncated}` is truncated" in lines[0], lines


def test_the_private_lightningcli_hooks_a_one_line_cli_needs_still_exist():
    """LayerwiseCLI checks `--ckpt_path` in `_parse_ckpt_path` (LightningCLI torch.loads it there, in `__init__`) and
    prints a UsageError raised inside the run from `_run_subcommand`: private LightningCLI methods (checked on 2.6)."""
    from lightning.pytorch.cli import LightningCLI

    assert callable(getattr(LightningCLI, "_parse_ckpt_path", None))
    assert callable(getattr(LightningCLI, "_run_subcommand", None))
