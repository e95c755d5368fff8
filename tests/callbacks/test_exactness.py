"""Lightning's DistributedSampler advice, replaced for layerwise's analysis by one line; kept for a module's own logs;
and an evaluation of a checkpoint labelled by its epoch and step: in plain Python as in ``layerwise validate``.

The launcher matrix (``tests/runs/test_launchers.py``) checks the real commands under ``ddp``/``ddp_spawn``/FSDP2/
``torchrun``: the line printed, the advice gone; ``tests/callbacks/test_callbacks_ddp.py`` that the analysis of 451
samples on 2 and 3 ranks is one process's. Here, the choices on a stand-in trainer, then ``Trainer.validate`` as a
user calls it without the command line: on one process, and on two (``ddp`` over gloo, a script that Lightning
launches again for rank 1).
"""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import TRAINING_ONLY, fitted_module, read_summary, train_loader, trainer, val_loader
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler

from layerwise._compat import already_reduced
from layerwise.callbacks import LayerwiseAnalysis
from layerwise.callbacks._exactness import say_counted_once, warn_repeated_own_logs, withhold_sampler_advice
from layerwise.errors import LayerwiseWarning

TESTS = Path(__file__).resolve().parents[1]
ADVICE = (
    "Using `DistributedSampler` with the dataloaders. During `trainer.validate()`, it is recommended to use "
    "`Trainer(devices=1, num_nodes=1)` to ensure each sample/batch gets evaluated exactly once. Otherwise, multi-device"
    " settings use `DistributedSampler` that replicates some samples to make sure all devices have same batch size in"
    " case of uneven inputs."
)
LINE = (
    "layerwise validate: 2 processes, and the analysis counts each sample once (DistributedSampler's repeated samples "
    "are dropped before its sums are reduced): the same numbers as on one process."
)


def stand_in(world_size: int, logged: dict, samples: int = 451) -> SimpleNamespace:
    sampler = DistributedSampler(list(range(samples)), num_replicas=world_size, rank=0, shuffle=False)
    loader = DataLoader(list(range(samples)), sampler=sampler)
    return SimpleNamespace(
        world_size=world_size,
        is_global_zero=True,
        progress_bar_callback=None,
        logged_metrics=logged,
        val_dataloaders=loader,
        test_dataloaders=[loader, loader],
    )


def lightning_advice_shown() -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(ADVICE, PossibleUserWarning, stacklevel=1)  # as Lightning's _resolve_sampler does
    return any("replicates some samples" in str(w.message) for w in caught)


def test_the_analysis_replaces_the_advice_by_one_line_and_a_modules_own_log_keeps_it(capsys):
    already_reduced({"val/acc/layer_01": 0.5, "step": 8})
    logged = {"val/acc/layer_01": torch.tensor(0.5), "val/my_loss": torch.tensor(1.0), "step": 8.0}
    trainer = stand_in(2, logged)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert withhold_sampler_advice(trainer, "validate")
        assert not lightning_advice_shown()
        say_counted_once(trainer, "validate")
        assert capsys.readouterr().out.splitlines() == [LINE]
        twice = r"^val/my_loss \(logged with `self.log`\) count 1 of the 451 samples twice"
        with pytest.warns(LayerwiseWarning, match=twice):
            warn_repeated_own_logs(trainer, "validate")


def test_without_repeats_a_modules_own_log_is_exact_too():
    trainer = stand_in(3, {"val/my_loss": torch.tensor(1.0)}, samples=450)  # 150 per rank, none repeated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert withhold_sampler_advice(trainer, "test")
        warn_repeated_own_logs(trainer, "test")
    assert not caught


@pytest.mark.parametrize("world_size, stage", [(1, "test"), (2, "fit")])
def test_without_processes_to_reduce_over_or_outside_an_evaluation_lightning_speaks_for_itself(world_size, stage):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert not withhold_sampler_advice(stand_in(world_size, {}), stage)
        assert lightning_advice_shown()


def test_the_modules_own_loss_and_accuracy_need_no_advice(tmp_path):
    """``<stage>/loss`` and ``<stage>/acc`` count each sample once (``tests/callbacks/test_callbacks_ddp.py``), so the
    module marks them reduced and the advice after the evaluation names only a user's own keys."""
    trainer(tmp_path, []).validate(fitted_module(), val_loader(101, batch_size=16), verbose=False)
    logged = {"val/loss": torch.tensor(1.0), "val/acc": torch.tensor(0.5), "val/my_loss": torch.tensor(1.0)}
    with pytest.warns(LayerwiseWarning, match=r"^val/my_loss \(logged with `self.log`\) count 1 of") as caught:
        warn_repeated_own_logs(stand_in(2, logged), "validate")
    assert len(caught) == 1 and "val/acc" not in str(caught[0].message) and "val/loss," not in str(caught[0].message)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a fit of 2 epochs of 4 steps: epoch 1, step 8 (a plain Trainer, no command line)."""
    root = tmp_path_factory.mktemp("fit")
    saving = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(val_dataloader|validation_step|no validation).*")
        job = trainer(root, [saving], max_epochs=2, enable_checkpointing=True, limit_val_batches=0)
        job.fit(fitted_module(), train_loader(64, batch_size=16))
    path = root / "checkpoints" / "last.ckpt"
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (1, 8)
    return path


@TRAINING_ONLY
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create the checkpoint")
def test_a_plain_validate_of_a_checkpoint_names_its_summary_by_the_checkpoints_epoch_and_step(tmp_path, checkpoint):
    """``trainer.validate(model, ckpt_path=…)`` in Python: the summary, its header and the console table carry the
    checkpoint's epoch 1 and step 8 (not 0 and 0, as if the model were untrained); the Trainer's counters are its
    own again after."""
    job = trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)])
    job.validate(fitted_module(), val_loader(101, batch_size=16), ckpt_path=checkpoint, verbose=False)
    summary = read_summary(tmp_path, epoch=1)
    assert (summary["epoch"], summary["global_step"]) == (1, 8)
    assert sorted(path.name for path in (tmp_path / "layerwise").glob("*.json")) == ["val_epoch_001_step_0000008.json"]
    assert (job.current_epoch, job.global_step) == (0, 0)


SCRIPT = """
import sys
import lightning.pytorch as pl
from helpers import fitted_backbone, val_loader
from layerwise.callbacks import LayerwiseAnalysis
from layerwise.lightning_modules import Standard


class Mine(Standard):  # a module that logs a value of its own: the samples it counted
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("val/my_count", float(len(batch[1])), reduce_fx="sum", sync_dist=True)
        return super().validation_step(batch, batch_idx, dataloader_idx)


job = pl.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False, default_root_dir=sys.argv[2],
    callbacks=[LayerwiseAnalysis(log_figures=False)],
)
(metrics,) = job.validate(Mine(fitted_backbone()), val_loader(101, batch_size=16), ckpt_path=sys.argv[1], verbose=False)
if job.is_global_zero:
    print("my_count", metrics["val/my_count"], "epoch", job.current_epoch, "step", job.global_step)
"""


@pytest.mark.slow  # a real 2-process script (about 20 s): in .ci/run's slow line
@pytest.mark.skipif(sys.platform != "linux", reason="Lightning's ddp launcher runs the script again for rank 1")
def test_a_plain_two_process_validate_says_it_counts_once_and_names_a_users_repeated_values(tmp_path, checkpoint):
    """A script with ``Trainer(devices=2, strategy="ddp")`` and ``validate(ckpt_path=…)``, no command line: the one
    line, Lightning's advice withheld, the user's ``val/my_count`` (102 of 101 samples) named in one warning, and the
    summary named by the checkpoint's epoch and step, as ``layerwise validate`` does."""
    script = tmp_path / "validate.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MASTER_", "LOCAL_RANK", "WORLD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    done = subprocess.run(
        [sys.executable, str(script), str(checkpoint), str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert done.stdout.count(LINE) == 1, done.stdout
    assert "my_count 102.0 epoch 0 step 0" in done.stdout  # the user's sum counted the repeat; counters put back
    assert "replicates some samples" not in done.stderr, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "LayerwiseWarning" in line]
    assert len(warned) == 1 and "val/my_count (logged with `self.log`) count 1 of the 101 samples twice" in warned[0]
    assert "val/acc" not in warned[0]  # the module's own, exact
    summary = read_summary(tmp_path / "out", epoch=1)
    assert (summary["epoch"], summary["global_step"], summary["num_samples"]) == (1, 8, 101)
