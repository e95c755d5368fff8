"""LightningDataModules, one file per data family; choose one with ``--data.class_path layerwise.datamodules.X``.

Every datamodule exposes ``num_classes``, ``img_size`` and ``in_chans`` right after ``__init__`` and yields batches
``(images float32 (B, C, H, W), labels int64 (B,))``.
"""

from layerwise.datamodules.cifar import CIFAR10DataModule, CIFAR100DataModule
from layerwise.datamodules.digits import DigitsDataModule
from layerwise.datamodules.imagenet import ImageNetDataModule

__all__ = ["CIFAR10DataModule", "CIFAR100DataModule", "DigitsDataModule", "ImageNetDataModule"]
