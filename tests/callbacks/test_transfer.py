"""Transfer (App. B.4): several validation dataloaders, each analysed and reported under its own name; the
corrupted digits; CIFAR-10.2 in its release format."""

import json

import numpy as np
import pytest
import torch
from helpers import FROZEN_IN_EVAL, assert_json_close, fitted_module, read_summary, trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from layerwise.callbacks import LayerwiseAnalysis
from layerwise.cli import main
from layerwise.datamodules.digits import DigitsDataModule, corrupt
from layerwise.features import MLPBackbone
from layerwise.results import loader_stages


def test_loader_stages_name_every_dataloader():
    assert loader_stages("val", object()) == ["val"]
    assert loader_stages("val", [1, 2, 3]) == ["val", "val_1", "val_2"]
    assert loader_stages("test", {"clean": 1, "CIFAR-10.2": 2}) == ["test", "test_cifar_10_2"]
    with pytest.raises(ValueError, match="same result name twice"):
        loader_stages("val", {"a": 1, "x-y": 2, "x_y": 3})


def test_corruption_rotates_within_the_bound_and_adds_noise():
    images = torch.zeros(200, 8, 8)
    images[:, 1:7, 3:5] = 1.0  # a vertical bar
    same = corrupt(images, 0.0, 0.0, seed=0)
    torch.testing.assert_close(same, images, rtol=0, atol=1e-6)
    rotated = corrupt(images, 15.0, 0.0, seed=0)
    assert (rotated - images).abs().amax(dim=(1, 2)).gt(0.05).float().mean() > 0.8  # most images really turn
    assert (corrupt(images, 90.0, 0.0, seed=0) - images).abs().amax() > (rotated - images).abs().amax()  # bounded
    noisy = corrupt(images, 0.0, 0.1, seed=0) - images
    assert abs(noisy.std().item() - 0.1) < 0.01 and torch.equal(
        corrupt(images, 15.0, 0.1, 0), corrupt(images, 15.0, 0.1, 0)
    )


def test_digits_datamodule_corrupted_set_and_class_subsets():
    data = DigitsDataModule(corrupted_val=True)
    data.setup()
    loaders = data.val_dataloader()
    assert list(loaders) == ["validation", "corrupted"]
    clean, corrupted = data.val_set.tensors, data.shifted_val_sets["corrupted"].tensors
    assert torch.equal(clean[1], corrupted[1]) and not torch.allclose(clean[0], corrupted[0])
    first, second = DigitsDataModule(classes=[0, 1, 2, 3, 4]), DigitsDataModule(classes=[5, 6, 7, 8, 9])
    for part in (first, second):
        part.setup()
        assert part.num_classes == 5 and sorted(part.train_set.tensors[1].unique().tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="--data.init_args.classes"):
        DigitsDataModule(classes=[1, 1])


def test_every_validation_dataloader_is_reported_under_its_own_name(tmp_path, capsys):
    data = DigitsDataModule(batch_size=64, corrupted_val=True)
    logger = TensorBoardLogger(str(tmp_path), name="run", default_hp_metric=False)
    fit = trainer(tmp_path, [LayerwiseAnalysis(figures_every_n_epochs=1)], logger=logger)
    fit.validate(fitted_module(), datamodule=data, verbose=False)
    log_dir = tmp_path / "run" / "version_0"
    clean, shifted = read_summary(log_dir), read_summary(log_dir, stage="val_corrupted")
    assert clean["stage"] == "val" and shifted["stage"] == "val_corrupted"
    assert clean["split"] == "validation" and shifted["split"] == "corrupted"
    assert clean["num_samples"] == shifted["num_samples"] == len(data.val_set)
    assert np.mean(shifted["accuracy"]) < np.mean(clean["accuracy"])  # the shift costs accuracy
    printed = capsys.readouterr().out
    assert "layerwise validation, epoch 0" in printed and "layerwise validation (corrupted), epoch 0" in printed

    # each set's analysis equals the analysis of that set alone
    for name, summary in (("validation", clean), ("corrupted", shifted)):
        alone = tmp_path / f"alone_{name}"
        loader = data.val_dataloader()[name]
        trainer(alone, [LayerwiseAnalysis(log_figures=False)]).validate(fitted_module(), loader, verbose=False)
        expected = read_summary(alone)
        del expected["run_id"], expected["stage"], expected["split"]  # a loader alone is named by its stage only
        assert_json_close({key: summary[key] for key in expected}, expected, atol=1e-9)

    # TensorBoard: scalars and images of both sets, under their names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"images": 0}).Reload()
    scalars, images = set(events.Tags()["scalars"]), set(events.Tags()["images"])
    for stage in ("val", "val_corrupted"):
        assert {f"{stage}/acc", f"{stage}/acc/layer_01", f"{stage}/cos_to_last/layer_04"} <= scalars
        assert {f"{stage}/cos", f"{stage}/cos_distribution"} <= images
    assert not any("dataloader_idx" in tag for tag in scalars)

    # layerwise plot draws the latest summary of each set
    main(["plot", str(log_dir), "--out", str(tmp_path / "figures"), "--format", "png"])
    written = {path.name for path in (tmp_path / "figures").iterdir()}
    assert {"val_epoch_000_step_0000000_cos.png", "val_corrupted_epoch_000_step_0000000_cos.png"} <= written


def test_cifar102_loader_reads_the_release_npz(tmp_path):
    from layerwise.datamodules.cifar import CIFAR10DataModule, NpzImageDataset

    g = np.random.default_rng(0)
    path = tmp_path / "cifar102_test.npz"
    images, labels = g.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8), g.integers(0, 10, 12)
    np.savez(path, images=images, labels=labels, label_names=np.array(["airplane"] * 10))
    data = CIFAR10DataModule(root=None, shifted_val={"cifar10.2": str(path)}, num_workers=0, batch_size=5)
    dataset = data._shifted_dataset("cifar10.2", str(path))
    assert isinstance(dataset, NpzImageDataset) and len(dataset) == 12
    image, label = dataset[3]
    assert image.shape == (3, 32, 32) and label == labels[3]
    mean, std = torch.tensor(data.mean).view(3, 1, 1), torch.tensor(data.std).view(3, 1, 1)
    raw = torch.from_numpy(images[3]).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(image, (raw - mean) / std)
    loader = DataLoader(dataset, batch_size=5)
    assert [len(y) for _, y in loader] == [5, 5, 2]
    with pytest.raises(FileNotFoundError, match="--data.init_args.shifted_val"):
        CIFAR10DataModule(shifted_val={"cifar10.2": str(tmp_path / "missing.npz")})
    bad = tmp_path / "bad.npz"
    np.savez(bad, pixels=images)
    with pytest.raises(ValueError, match="'images' and 'labels'"):
        data._shifted_dataset("bad", str(bad))
    json.dumps(loader_stages("val", {"validation": 0, "cifar10.2": 1}))  # the name is JSON and file safe
    assert loader_stages("val", {"validation": 0, "cifar10.2": 1})[1] == "val_cifar10_2"


def frozen_features(backbone, data):
    """Every layer's training and validation features (L, n, d) of a frozen backbone, float64, and the targets."""
    backbone.eval()
    with torch.no_grad():
        (train_x, train_y), (val_x, val_y) = data.train_set.tensors, data.val_set.tensors
        return backbone(train_x).double(), train_y, backbone(val_x).double(), val_y


def random_mlp_features(depth: int = 4):
    torch.manual_seed(0)
    data = DigitsDataModule(batch_size=64, classes=[5, 6, 7, 8, 9])
    data.setup()
    backbone = MLPBackbone(in_features=64, width=24, depth=depth, num_classes=5)  # random features: a real job
    return backbone, data, frozen_features(backbone, data)


def logistic_regression(train_h, train_y, weight_decay):
    """scikit-learn's LogisticRegression with the probe's objective: C = 1 / (weight_decay * n), tight tolerance."""
    from sklearn.linear_model import LogisticRegression

    regression = LogisticRegression(C=1.0 / (weight_decay * len(train_y)), tol=1e-10, max_iter=100000)
    return regression.fit(train_h.numpy(), train_y.numpy())


@pytest.mark.parametrize("solver", ["newton", "lbfgs"])
def test_fit_logistic_equals_logistic_regression(solver, monkeypatch, single_thread):
    """The head's objective is LogisticRegression's at C = 1 / (weight_decay * n): same coefficients, same
    predictions, on frozen random-MLP features of digits 5-9 (both solvers: Newton for small heads, L-BFGS)."""
    from layerwise.lightning_modules import probes

    if solver == "lbfgs":
        monkeypatch.setattr(probes, "NEWTON_MAX_PARAMETERS", 0)
    _, _, (train_h, train_y, val_h, val_y) = random_mlp_features()
    layers = range(len(train_h)) if solver == "newton" else [1]
    for layer in layers:
        for decay in (1e-2, 1e-4):
            fit = probes.fit_logistic(train_h[layer], train_y, 5, decay)
            assert fit.converged and fit.weight.shape == (5, 24) and fit.bias.shape == (5,)
            reference = logistic_regression(train_h[layer], train_y, decay)
            scale = np.abs(reference.coef_).max()
            np.testing.assert_allclose(fit.weight.numpy(), reference.coef_, rtol=0, atol=1e-3 * scale)
            np.testing.assert_allclose(fit.bias.numpy(), reference.intercept_, rtol=0, atol=1e-3 * scale)
            predictions = (val_h[layer] @ fit.weight.T + fit.bias).argmax(-1).numpy()
            assert np.mean(predictions != reference.predict(val_h[layer].numpy())) <= 0.01
            accuracy = np.mean(predictions == val_y.numpy())
            assert abs(accuracy - reference.score(val_h[layer].numpy(), val_y.numpy())) <= 0.01


def test_fit_probe_chooses_the_weight_decay_on_held_out_samples(single_thread):
    """The decay with the best held-out accuracy (ties: the larger), as scikit-learn picks it on the same split."""
    from layerwise.lightning_modules.probes import fit_probe

    _, _, (train_h, train_y, _, _) = random_mlp_features()
    decays = (1.0, 1e-1, 1e-2, 1e-3, 1e-4)
    n = len(train_y)
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    holdout, rest = permutation[: round(0.25 * n)], permutation[round(0.25 * n) :]
    for layer in (0, 3):
        fit = fit_probe(train_h[layer], train_y, 5, decays, holdout_fraction=0.25, seed=3)
        scores = [
            logistic_regression(train_h[layer][rest], train_y[rest], decay).score(
                train_h[layer][holdout].numpy(), train_y[holdout].numpy()
            )
            for decay in decays
        ]
        assert fit.weight_decay == decays[int(np.argmax(scores))]  # argmax: the first best, the larger decay
        reference = logistic_regression(train_h[layer], train_y, fit.weight_decay)  # refitted on all samples
        np.testing.assert_allclose(fit.weight.numpy(), reference.coef_, atol=1e-3 * np.abs(reference.coef_).max())


@FROZEN_IN_EVAL
def test_linear_probes_equal_logistic_regression_on_the_same_frozen_features(tmp_path):
    from layerwise.lightning_modules import LinearProbes

    backbone, data, (train_h, train_y, val_h, val_y) = random_mlp_features()
    frozen = {name: value.clone() for name, value in backbone.state_dict().items()}
    probes = LinearProbes(num_classes=5, backbone=backbone)
    trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)], max_epochs=2).fit(probes, datamodule=data)
    for name, value in backbone.state_dict().items():  # the backbone stayed frozen
        assert torch.equal(value, frozen[name]), name
    assert probes.fitted and set(probes.weight_decay.tolist()) <= set(probes.weight_decays)
    probe_accuracy = read_summary(tmp_path, epoch=1)["accuracy"]
    assert probe_accuracy == read_summary(tmp_path, epoch=0)["accuracy"]  # fitted once, in the first epoch
    reference = [
        logistic_regression(train_h[layer], train_y, decay).score(val_h[layer].numpy(), val_y.numpy())
        for layer, decay in enumerate(probes.weight_decay.tolist())
    ]
    assert 0.5 < min(reference) and min(reference) < 0.99  # well above chance (0.2), not at a ceiling
    np.testing.assert_allclose(probe_accuracy, reference, rtol=0, atol=0.01)


@FROZEN_IN_EVAL
def test_linear_probes_on_two_processes_equal_one(tmp_path, single_thread):
    """The features of both ranks are gathered (the sampler's padding dropped) and fitted in one order."""
    from layerwise.lightning_modules import LinearProbes

    torch.manual_seed(0)
    weights = MLPBackbone(in_features=64, width=24, depth=3, num_classes=5).state_dict()
    summaries, decays = {}, {}
    for devices in (1, 2):
        backbone = MLPBackbone(in_features=64, width=24, depth=3, num_classes=5)
        backbone.load_state_dict(weights)
        data = DigitsDataModule(batch_size=50, classes=[5, 6, 7, 8, 9], val_fraction=0.19)  # 729 samples: 1 padded
        options = dict(devices=2, strategy="ddp_fork") if devices == 2 else {}
        run = trainer(tmp_path / str(devices), [LayerwiseAnalysis(log_figures=False)], max_epochs=1, **options)
        probes = LinearProbes(num_classes=5, backbone=backbone, weight_decays=[1e-2, 1e-3, 1e-4])
        run.fit(probes, datamodule=data)
        summaries[devices] = read_summary(tmp_path / str(devices))
        del summaries[devices]["global_step"]  # each rank steps through its half of the batches
        decays[devices] = probes.weight_decay.tolist()
    assert summaries[1]["num_samples"] == summaries[2]["num_samples"]
    assert decays[1] == decays[2]
    assert summaries[1]["accuracy"] == summaries[2]["accuracy"]
    assert_json_close(summaries[2], summaries[1], atol=1e-6)


@pytest.mark.slow
def test_probes_on_the_shipped_transfer_pipeline_equal_logistic_regression(tmp_path, capsys):
    """configs/transfer as shipped: pretrain digits_vit_standard.yaml (30 epochs), then digits_probe.yaml on its
    checkpoint; every layer's probe accuracy within 1 point of scikit-learn's LogisticRegression on the same frozen
    features at the probe's held-out-chosen C = 1 / (weight_decay * n). LogisticRegression at its default C = 1 is
    printed beside it (benchmarks/probes.py records both for docs/appendices/transfer.md)."""
    from pathlib import Path

    from layerwise.cli import LayerwiseCLI

    configs = Path(__file__).resolve().parents[2] / "configs" / "transfer"
    save = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    LayerwiseCLI(args=["fit", f"--config={configs / 'digits_vit_standard.yaml'}", *save])
    checkpoint = tmp_path / "transfer_standard" / "version_0" / "checkpoints" / "last.ckpt"
    probe = [f"--config={configs / 'digits_probe.yaml'}", f"--model.init_args.checkpoint={checkpoint}"]
    cli = LayerwiseCLI(args=["fit", *probe, *save])
    probe_accuracy = read_summary(tmp_path / "transfer_probe" / "version_0")["accuracy"]
    train_h, train_y, val_h, val_y = frozen_features(cli.model.backbone, cli.datamodule)
    chosen = [
        logistic_regression(train_h[layer], train_y, decay).score(val_h[layer].numpy(), val_y.numpy())
        for layer, decay in enumerate(cli.model.weight_decay.tolist())
    ]
    default = [
        logistic_regression(train_h[layer], train_y, 1.0 / len(train_y)).score(val_h[layer].numpy(), val_y.numpy())
        for layer in range(len(train_h))
    ]
    with capsys.disabled():
        print(f"\nprobe {probe_accuracy}\nLogisticRegression(chosen C) {chosen}\nLogisticRegression(C=1) {default}")
    assert len(chosen) == 6 and 0.4 < min(chosen) and max(chosen) < 0.99
    np.testing.assert_allclose(probe_accuracy, chosen, rtol=0, atol=0.01)


def test_linear_probes_refuse_bad_options(tmp_path):
    from layerwise.lightning_modules import LinearProbes

    option = "--model.init_args"
    with pytest.raises(ValueError, match=f"exactly one of `{option}.checkpoint` and `{option}.backbone`"):
        LinearProbes(num_classes=5)
    with pytest.raises(ValueError, match="--model.init_args.checkpoint=.*no such file"):
        LinearProbes(num_classes=5, checkpoint=str(tmp_path / "missing.ckpt"))
    backbone = fitted_module().backbone
    with pytest.raises(ValueError, match=r"weight_decays=\[0.1, 0.0\]` must be a non-empty list of positive"):
        LinearProbes(num_classes=5, backbone=backbone, weight_decays=[0.1, 0.0])
    with pytest.raises(ValueError, match="holdout_fraction=1.0` must lie strictly between 0 and 1"):
        LinearProbes(num_classes=5, backbone=backbone, holdout_fraction=1.0)
    probes = LinearProbes(num_classes=3, backbone=backbone)
    with pytest.raises(ValueError, match="num_classes=3` but the data has 5 classes"):
        trainer(tmp_path, []).validate(probes, datamodule=DigitsDataModule(classes=[5, 6, 7, 8, 9]), verbose=False)
