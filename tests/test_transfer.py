"""Transfer (App. B.4): several validation dataloaders, each analysed and reported under its own name; the
corrupted digits; CIFAR-10.2 in its release format."""

import json

import numpy as np
import pytest
import torch
from helpers import assert_json_close, fitted_module, read_summary, trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from layerwise.callbacks import LayerwiseAnalysis
from layerwise.cli import main
from layerwise.datamodules.digits import DigitsDataModule, corrupt
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
    assert clean["num_samples"] == shifted["num_samples"] == len(data.val_set)
    assert np.mean(shifted["accuracy"]) < np.mean(clean["accuracy"])  # the shift costs accuracy
    printed = capsys.readouterr().out
    assert "layerwise val (epoch 0" in printed and "layerwise val_corrupted (epoch 0" in printed

    # each set's analysis equals the analysis of that set alone
    for name, summary in (("validation", clean), ("corrupted", shifted)):
        alone = tmp_path / f"alone_{name}"
        loader = data.val_dataloader()[name]
        trainer(alone, [LayerwiseAnalysis(log_figures=False)]).validate(fitted_module(), loader, verbose=False)
        expected = read_summary(alone)
        del expected["run_id"], expected["stage"]
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


def test_linear_probes_reach_logistic_regression_on_the_same_frozen_features(tmp_path):
    from functools import partial

    from sklearn.linear_model import LogisticRegression

    from layerwise.features import MLPBackbone
    from layerwise.lightning_modules import LinearProbes

    torch.manual_seed(0)
    data = DigitsDataModule(batch_size=64, classes=[5, 6, 7, 8, 9])
    data.setup()
    backbone = MLPBackbone(in_features=64, width=24, depth=4, num_classes=5)  # random features: a real probing job
    frozen = {name: value.clone() for name, value in backbone.state_dict().items()}
    probes = LinearProbes(num_classes=5, backbone=backbone, optimizer=partial(torch.optim.AdamW, lr=0.03))
    callback = LayerwiseAnalysis(log_figures=False)
    trainer(tmp_path, [callback], max_epochs=40).fit(probes, datamodule=data)
    for name, value in backbone.state_dict().items():  # the backbone stayed frozen
        assert torch.equal(value, frozen[name]), name
    probe_accuracy = read_summary(tmp_path, epoch=39)["accuracy"]

    with torch.no_grad():
        train_x, train_y = data.train_set.tensors
        val_x, val_y = data.val_set.tensors
        train_h, val_h = backbone(train_x).numpy(), backbone(val_x).numpy()
    reference = []
    for layer in range(backbone.num_layers):
        regression = LogisticRegression(max_iter=5000).fit(train_h[layer], train_y.numpy())
        reference.append(regression.score(val_h[layer], val_y.numpy()))
    assert 0.5 < min(reference) and min(reference) < 0.99  # well above chance (0.2), not at a ceiling
    np.testing.assert_allclose(probe_accuracy, reference, atol=0.02)


def test_linear_probes_refuse_bad_options(tmp_path):
    from layerwise.lightning_modules import LinearProbes

    with pytest.raises(ValueError, match="exactly one of `--model.init_args.checkpoint` and `backbone`"):
        LinearProbes(num_classes=5)
    with pytest.raises(ValueError, match="--model.init_args.checkpoint=.*no such file"):
        LinearProbes(num_classes=5, checkpoint=str(tmp_path / "missing.ckpt"))
    probes = LinearProbes(num_classes=3, backbone=fitted_module().backbone)
    with pytest.raises(ValueError, match="num_classes=3` but the data has 5 classes"):
        trainer(tmp_path, []).validate(probes, datamodule=DigitsDataModule(classes=[5, 6, 7, 8, 9]), verbose=False)
