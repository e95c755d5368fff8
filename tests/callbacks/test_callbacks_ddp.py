"""DDP on CPU with gloo: the analysis of 2 (3 or 4) processes equals the analysis of 1 process, value for value.

The validation set has 101 (or 451) samples and batches of 16, so ``DistributedSampler`` pads every rank to the same
length (51 + 51 on 2 ranks: one sample counted twice unless the callback drops it) and every rank ends on a ragged
batch.
Processes are started with Lightning's ``ddp_fork``: the children inherit the imported modules and the weights (the
state dict is saved once and loaded before launching), where ``ddp_spawn`` would re-import torch, Lightning and timm
in every child (about 15 s each on a loaded 2-core box). The children run a single intra-op thread, as DataLoader
workers do, so a forked OpenMP pool is never used.
"""

import copy

import numpy as np
import pytest
import torch
from helpers import (
    assert_json_close,
    digits,
    fitted_module,
    read_features,
    read_summary,
    train_loader,
    trainer,
    val_loader,
)
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from layerwise.analyses.neural_collapse import HEAD, NCC, STREAMED
from layerwise.callbacks import LayerwiseAnalysis, NeuralCollapseMonitor, ResidualNormRatioMonitor
from layerwise.features import FEATURES

N = 101


def loader(num_samples: int) -> DataLoader:
    """``num_samples`` digits in a fixed order, batches of 16: the validation set, or training images past its 360."""
    if num_samples <= 360:
        return val_loader(num_samples, batch_size=16)
    x, y, _, _ = digits()
    return DataLoader(TensorDataset(x[:num_samples], y[:num_samples]), batch_size=16)


def analyse(root, weights, num_samples=N, **trainer_options):
    module = fitted_module()
    module.load_state_dict(torch.load(weights))
    callbacks = [LayerwiseAnalysis(save_features=True, log_figures=False), ResidualNormRatioMonitor(log_figures=False)]
    trainer(root, callbacks, **trainer_options).validate(module, loader(num_samples), verbose=False)
    return read_summary(root), read_features(root)


# 101 on 2 ranks: 51 + 51, one repeat; 451 (the size an independent check measured) on 2: 226 + 226, one repeat, and
# on 3: 151 x 3, two repeats; 101 on 4: 26 x 4, three repeats. Every rank ends on a ragged batch.
@pytest.mark.parametrize(
    "num_samples, devices",
    [(N, 2), (451, 2), pytest.param(451, 3, marks=pytest.mark.slow), pytest.param(N, 4, marks=pytest.mark.slow)],
)
def test_processes_match_one_process(tmp_path, single_thread, num_samples, devices):
    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    one, one_features = analyse(tmp_path / "one", weights, num_samples)
    many, many_features = analyse(tmp_path / "many", weights, num_samples, devices=devices, strategy="ddp_fork")

    assert one["num_samples"] == many["num_samples"] == num_samples  # the sampler's padding is not counted
    assert one["residual_norm_ratio"]["num_samples"] == many["residual_norm_ratio"]["num_samples"] == num_samples
    assert sum(many["saturation_counts"]) == num_samples
    assert all(sum(row["exit_counts"]) == num_samples for row in many["early_exit"])
    assert_json_close(many, one, atol=1e-6, rtol=1e-6)

    labels = loader(num_samples).dataset.tensors[1].tolist()
    assert many_features["labels"].tolist() == one_features["labels"].tolist() == labels
    assert torch.equal(many_features["predictions"], one_features["predictions"])
    for key in ("features", "max_prob"):
        assert many_features[key].shape == one_features[key].shape
        torch.testing.assert_close(many_features[key], one_features[key], rtol=0, atol=1e-6)


# Neural collapse complete (NC1-NC4) in the one runner, beside every default analysis: 451 samples, batches of 16,
# every rank ends on a ragged batch and the sampler repeats samples 0 (2 ranks) or 0 and 1 (3 ranks). NC4's
# nearest-class-centre buffer holds each rank's own rows: the repeats must not be classified twice.
@pytest.mark.parametrize("devices", [2, 3])
def test_complete_neural_collapse_on_processes_matches_one_process(tmp_path, single_thread, devices):
    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    summaries = {}
    for processes in (1, devices):
        module = fitted_module()
        module.load_state_dict(torch.load(weights))
        collapse = NeuralCollapseMonitor(complete=True, ncc=True)
        options = dict(devices=processes, strategy="ddp_fork") if processes > 1 else {}
        run = trainer(
            tmp_path / str(processes), [LayerwiseAnalysis(neural_collapse=collapse, log_figures=False)], **options
        )
        run.validate(module, loader(451), verbose=False)
        assert run.world_size == processes
        summaries[processes] = read_summary(tmp_path / str(processes))
    one, many = summaries[1], summaries[devices]
    for key in ("nc1", *STREAMED, *HEAD, *NCC):
        values = np.asarray(one[key], dtype=float)
        assert values.shape == (len(one["layers"]),) and np.isfinite(values).all(), key
    assert many["num_samples"] == one["num_samples"] == 451
    assert_json_close(many, one, atol=1e-6, rtol=1e-6)  # every analysis, as in the test above
    for key in ("nc1", *STREAMED, *HEAD, *NCC):  # float64 sums of float32 features: only the order of the sums differs
        np.testing.assert_allclose(many[key], one[key], rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("devices", [1, 2])
def test_checkpoint_and_early_stopping_monitor_a_per_layer_accuracy(tmp_path, single_thread, devices):
    """The callback logs through Lightning, so ModelCheckpoint and EarlyStopping can monitor what it computes."""
    key = "val/acc/layer_02"
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints",
        monitor=key,
        mode="max",
        save_top_k=1,
        filename="epoch{epoch}-acc{val/acc/layer_02:.8f}",
        auto_insert_metric_name=False,
    )
    # min_delta 1.0 can never be met: the first validation sets the best, the second stops the run
    stopping = EarlyStopping(monitor=key, mode="max", patience=1, min_delta=1.0, strict=True)
    options = dict(devices=devices, strategy="ddp_fork") if devices > 1 else {}
    run = trainer(
        tmp_path,
        [LayerwiseAnalysis(log_figures=False), checkpoint, stopping],
        max_epochs=5,
        limit_train_batches=2,
        enable_checkpointing=True,
        **options,
    )
    run.fit(fitted_module(), train_loader(), val_loader(N, batch_size=16))

    epochs = sorted(path.name.split("_step_")[0] for path in (tmp_path / "layerwise").glob("val_epoch_*.json"))
    assert epochs == ["val_epoch_000", "val_epoch_001"], "EarlyStopping must stop after two validations"
    accuracy = [read_summary(tmp_path, epoch=epoch)["accuracy"][1] for epoch in (0, 1)]
    best = 0 if accuracy[0] >= accuracy[1] else 1
    (saved,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert saved.name == f"epoch{best}-acc{accuracy[best]:.8f}.ckpt"  # the global value, also on 2 processes


def test_several_validation_dataloaders_on_two_processes_match_one(tmp_path, single_thread):
    """Each validation set (clean digits, corrupted digits: 360 samples, uneven batches) is reduced on its own."""
    from layerwise.datamodules.digits import DigitsDataModule

    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    summaries = {}
    for devices in (1, 2):
        module = fitted_module()
        module.load_state_dict(torch.load(weights))
        options = dict(devices=2, strategy="ddp_fork") if devices == 2 else {}
        run = trainer(tmp_path / str(devices), [LayerwiseAnalysis(log_figures=False)], **options)
        run.validate(module, datamodule=DigitsDataModule(batch_size=50, corrupted_val=True), verbose=False)
        summaries[devices] = {stage: read_summary(tmp_path / str(devices), stage) for stage in ("val", "val_corrupted")}
    for stage in ("val", "val_corrupted"):
        assert summaries[1][stage]["num_samples"] == summaries[2][stage]["num_samples"] == 360
        assert_json_close(summaries[2][stage], summaries[1][stage], atol=1e-6, rtol=1e-6, where=stage)
    assert summaries[1]["val"]["accuracy"] != summaries[1]["val_corrupted"]["accuracy"]


def last_layer_reference(module, num_samples: int) -> dict[str, float]:
    """``val/loss`` and ``val/acc`` of the last layer over all samples at once, in float64 with numpy: one forward
    pass of every sample, the head applied by hand, no Trainer, no sampler, no readout, no logging."""
    x, y = loader(num_samples).dataset.tensors
    model = copy.deepcopy(module).double().eval()
    with torch.no_grad():
        logits = model.backbone.head(model.samples((x.double(), y))[FEATURES][-1]).numpy()
    labels = y.numpy()
    shifted = logits - logits.max(axis=1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(labels)), labels]
    return {"val/loss": float(np.mean(nll)), "val/acc": float(np.mean(logits.argmax(axis=1) == labels)), "nll": nll}


# 451 on 2 ranks: 226 + 225 real (sample 0 repeated on rank 1); on 3: 151 + 150 + 150 (samples 0 and 1 repeated).
# In float64 ("64-true") the only difference left is the order of the sums: 1e-12. A float32 model's loss differs from
# the float64 reference by its own rounding (float32's 1.2e-7 relative on each row's loss of about 2.5; measured:
# 1.6e-8 on the mean), whatever the number of processes: 1e-6.
@pytest.mark.parametrize(
    "devices, precision, atol",
    [(2, "64-true", 1e-12), pytest.param(3, "64-true", 1e-12, marks=pytest.mark.slow), (2, "32-true", 1e-6)],
)
def test_the_modules_own_loss_and_accuracy_count_each_sample_once(tmp_path, single_thread, devices, precision, atol):
    """``val/loss`` and ``val/acc`` (logged by the module itself) equal one process's and the float64 reference."""
    module = fitted_module()
    reference = last_layer_reference(module, 451)
    weights = tmp_path / "weights.pt"
    torch.save(module.state_dict(), weights)
    logged = {}
    for processes in (1, devices):
        module = fitted_module()
        module.load_state_dict(torch.load(weights))
        options = dict(devices=processes, strategy="ddp_fork") if processes > 1 else {}
        run = trainer(tmp_path / str(processes), [], precision=precision, **options)
        (logged[processes],) = run.validate(module, loader(451), verbose=False)
    for key in ("val/loss", "val/acc"):
        assert logged[devices][key] == pytest.approx(reference[key], rel=0, abs=atol), key
        assert logged[1][key] == pytest.approx(reference[key], rel=0, abs=atol), key
    # the mean with the sampler's repeats (what sync_dist=True gave) is further off than the tolerance
    repeats = list(range(-len(reference["nll"]) % devices))
    padded = np.concatenate([reference["nll"], reference["nll"][repeats]]).mean()
    assert abs(padded - reference["val/loss"]) > 100 * atol
