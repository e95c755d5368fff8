"""Lightning's DistributedSampler advice, replaced for layerwise's analysis by one line; kept for a module's own logs.

The launcher matrix (``tests/runs/test_launchers.py``) checks the real commands under ``ddp``/``ddp_spawn``/FSDP2/
``torchrun``: the line printed, the advice gone; ``tests/callbacks/test_callbacks_ddp.py`` that the analysis of 451
samples on 2 and 3 ranks is one process's. Here, the callback's choices on a stand-in trainer.
"""

import warnings
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader, DistributedSampler

from layerwise._compat import already_reduced
from layerwise.callbacks import LayerwiseAnalysis
from layerwise.cli.exactness import ExactnessLine
from layerwise.errors import LayerwiseWarning

ADVICE = (
    "Using `DistributedSampler` with the dataloaders. During `trainer.validate()`, it is recommended to use "
    "`Trainer(devices=1, num_nodes=1)` to ensure each sample/batch gets evaluated exactly once. Otherwise, multi-device"
    " settings use `DistributedSampler` that replicates some samples to make sure all devices have same batch size in"
    " case of uneven inputs."
)


def stand_in(world_size: int, analysed: bool, logged: dict, samples: int = 451) -> SimpleNamespace:
    callbacks = [LayerwiseAnalysis(log_figures=False)] if analysed else []
    sampler = DistributedSampler(list(range(samples)), num_replicas=world_size, rank=0, shuffle=False)
    loader = DataLoader(list(range(samples)), sampler=sampler)
    return SimpleNamespace(
        world_size=world_size,
        callbacks=callbacks,
        is_global_zero=True,
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
    trainer = stand_in(2, True, logged)
    line = ExactnessLine("validate")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        line.setup(trainer, None, "validate")
        assert not lightning_advice_shown()
        line.on_validation_start(trainer, None)
        assert capsys.readouterr().out.splitlines() == [
            "layerwise validate: 2 processes, and the analysis counts each sample once (DistributedSampler's repeated "
            "samples are dropped before its sums are reduced): the same numbers as on one process."
        ]
        twice = r"^val/my_loss \(logged with `self.log`\) count 1 of the 451 samples twice"
        with pytest.warns(LayerwiseWarning, match=twice):
            line.teardown(trainer, None, "validate")


def test_without_repeats_a_modules_own_log_is_exact_too():
    trainer = stand_in(3, True, {"val/my_loss": torch.tensor(1.0)}, samples=450)  # 150 per rank, none repeated
    line = ExactnessLine("test")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line.setup(trainer, None, "test")
        line.teardown(trainer, None, "test")
    assert not caught


@pytest.mark.parametrize("world_size, analysed", [(1, True), (2, False)])
def test_without_processes_to_reduce_over_or_an_analysis_lightning_speaks_for_itself(capsys, world_size, analysed):
    trainer = stand_in(world_size, analysed, {"val/my_loss": torch.tensor(1.0)})
    line = ExactnessLine("test")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        line.setup(trainer, None, "test")
        assert lightning_advice_shown()
        line.on_test_start(trainer, None)
        with warnings.catch_warnings(record=True) as caught:
            line.teardown(trainer, None, "test")
    assert capsys.readouterr().out == "" and not caught


def test_the_modules_own_loss_and_accuracy_need_no_advice(tmp_path):
    """``<stage>/loss`` and ``<stage>/acc`` count each sample once (``tests/callbacks/test_callbacks_ddp.py``), so the
    module marks them reduced and the advice after the evaluation names only a user's own keys."""
    from helpers import fitted_module, trainer, val_loader

    trainer(tmp_path, []).validate(fitted_module(), val_loader(101, batch_size=16), verbose=False)
    logged = {"val/loss": torch.tensor(1.0), "val/acc": torch.tensor(0.5), "val/my_loss": torch.tensor(1.0)}
    line = ExactnessLine("validate")
    stand = stand_in(2, True, logged)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        line.setup(stand, None, "validate")
        with pytest.warns(LayerwiseWarning, match=r"^val/my_loss \(logged with `self.log`\) count 1 of") as caught:
            line.teardown(stand, None, "validate")
    assert len(caught) == 1 and "val/acc" not in str(caught[0].message) and "val/loss," not in str(caught[0].message)
