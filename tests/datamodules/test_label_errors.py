"""A label outside the model's classes is named with its set, file and the class count before any step runs."""

from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from helpers import tiny_backbone, trainer
from test_datamodules import skip_md5, write_cifar  # noqa: F401 (skip_md5 is a fixture)
from torch.utils.data import TensorDataset

from layerwise.cli import LayerwiseCLI
from layerwise.datamodules import CIFAR10DataModule, DigitsDataModule
from layerwise.datamodules._hub import HubImageDataset
from layerwise.datamodules.labels import dataset_labels
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")


class DigitsWithALabel12(DigitsDataModule):
    """The digits, one training label set to 12 (a ten-class model has no class 12)."""

    def setup(self, stage=None):
        super().setup(stage)
        images, labels = self.train_set.tensors
        labels = labels.clone()
        labels[5] = 12
        self.train_set = TensorDataset(images, labels)


class NoStep(Standard):
    def training_step(self, batch, batch_idx):
        raise AssertionError("a training step ran before the label check")


def test_fit_names_the_label_the_set_and_the_class_count_before_training(tmp_path):
    module = NoStep(tiny_backbone())
    with pytest.raises(ValueError) as error:
        trainer(tmp_path, [], max_steps=2).fit(module, datamodule=DigitsWithALabel12(batch_size=16))
    message = str(error.value)
    assert message.startswith("The train set of DigitsWithALabel12 has the label 12 (1 of 1437 samples outside 0..9)")
    assert "the model's 10 classes (`--model.init_args.backbone.init_args.num_classes=10`)" in message


def test_a_shifted_npz_with_a_foreign_label_is_named_by_its_file(tmp_path, skip_md5):  # noqa: F811
    write_cifar(tmp_path, "cifar10")
    shifted = tmp_path / "shift.npz"
    rng = np.random.default_rng(0)
    labels = np.array([3, 12, 1, 12])
    np.savez(shifted, images=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8), labels=labels)
    datamodule = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0, shifted_val={"v2": str(shifted)})
    backbone = TimmViT(img_size=32, patch_size=8, in_chans=3, embed_dim=16, depth=1, num_heads=2, num_classes=10)
    with pytest.raises(ValueError, match=rf"^`{shifted}` \(v2 set\) has the label 12 \(2 of 4 samples outside 0..9\)"):
        trainer(tmp_path, []).validate(Standard(backbone), datamodule=datamodule, verbose=False)


def test_labels_are_read_from_hub_splits_without_decoding_images():
    table = datasets.Dataset.from_dict({"img": [None, None], "label": [4, 11]})
    source, labels = dataset_labels(HubImageDataset(table, "img", "label", None))
    assert labels.tolist() == [4, 11] and "column 'label'" in source


def test_labels_in_range_pass_and_fit_runs(tmp_path):
    module = Standard(tiny_backbone(), optimizer=lambda params: torch.optim.SGD(params, lr=0.01))
    job = trainer(tmp_path, [], max_steps=1, limit_val_batches=0)
    job.fit(module, datamodule=DigitsDataModule(batch_size=16))
    assert job.global_step == 1


def test_the_cli_names_the_label_in_one_line_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(
            args=[
                "fit",
                "--config",
                QUICKSTART,
                "--data.class_path=test_label_errors.DigitsWithALabel12",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                "--trainer.enable_progress_bar=false",
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "The train set of DigitsWithALabel12 has the label 12" in lines[0]
    assert not any(tmp_path.rglob("*.ckpt"))
