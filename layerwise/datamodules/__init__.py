"""LightningDataModules, one file per data family; choose one with ``--data.class_path layerwise.datamodules.X``.

Image datamodules expose ``num_classes``, ``img_size`` and ``in_chans`` right after ``__init__`` and yield batches
``(images float32 (B, C, H, W), labels int64 (B,))``. Text datamodules yield dict batches (``input_ids`` and
``attention_mask`` int64 (B, T), plus ``labels`` for classification) and expose ``vocab_size`` once their tokenizer
is loaded.
"""

from layerwise.datamodules.cifar import CIFAR10DataModule, CIFAR100DataModule
from layerwise.datamodules.digits import DigitsDataModule
from layerwise.datamodules.glue import GLUEDataModule
from layerwise.datamodules.imagenet import ImageNetDataModule
from layerwise.datamodules.text import TextDataModule

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "DigitsDataModule",
    "GLUEDataModule",
    "ImageNetDataModule",
    "TextDataModule",
]
