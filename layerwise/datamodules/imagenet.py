"""ImageNet-1k (or any ImageFolder tree laid out like it), from a local folder or from the Hugging Face Hub."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from PIL import Image
from timm.data import auto_augment, create_transform
from torchvision.datasets import ImageFolder

from layerwise.datamodules._base import ImageDataModule, check_positive_int, flag, resolve_root
from layerwise.datamodules._hub import HubImageDataset, hub_split, load_hub_dataset

IMAGENET_CLASSES = 1000
ROOT_HINT = "/path/to/imagenet (holding train/<wnid>/*.JPEG and val/<wnid>/*.JPEG)"


def _posterize_keeping_zero_bits(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """Posterize as timm does, except that keeping 0 bits gives a black image (Pillow now refuses ``bits=0``)."""
    if bits_to_keep <= 0:
        return img.point(lambda _: 0)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)


def _allow_zero_bit_posterize(transform: Callable) -> Callable:
    """Swap the posterize op inside timm's RandAugment for :func:`_posterize_keeping_zero_bits`.

    With ``rand-m9-mstd0.5-inc1`` the sampled magnitude is clipped at 10, where ``PosterizeIncreasing`` asks for 0
    bits; Pillow 13 raises ``ValueError`` on that, which crashed about one training image in a thousand here.
    """
    for step in getattr(transform, "transforms", []):
        for op in getattr(step, "ops", []):
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = _posterize_keeping_zero_bits
    return transform


def _class_folders(directory: Path) -> list[str]:
    """Sorted names of the sub-folders of ``directory``: ImageFolder's classes, in label order."""
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


class ImageNetDataModule(ImageDataModule):
    """ImageNet-1k classification with the standard timm/DeiT transforms.

    Source: with ``root``, an ImageFolder tree ``root/train/<class>/*`` and ``root/val/<class>/*`` read by
    ``torchvision.datasets.ImageFolder`` (classes = sorted sub-folder names, the same set in both; the raw ILSVRC
    validation folder must first be sorted into class folders). ``num_classes`` is the number of class folders, so
    a subset tree reports its own count. Without ``root``, the Hub dataset ``hub_id`` (columns "image", "label";
    splits "train", "validation"; ``num_classes`` = 1000) via ``datasets.load_dataset`` in ``prepare_data``/
    ``setup``; ``ILSVRC/imagenet-1k`` is gated (``hf auth login`` and accepted terms), and an unreachable Hub raises
    ``ConnectionError`` within seconds.

    Splits: training = ``train``; validation = ``val`` (Hub: ``validation``), the official 50000-image validation
    set. The official test split has no public labels, so ``test_dataloader`` and ``predict_dataloader`` return the
    validation split.

    Transforms (timm ``create_transform``, ImageNet mean/std): training RandomResizedCrop(``img_size``, bicubic),
    horizontal flip, RandAugment ``rand-m9-mstd0.5-inc1``, colour-jitter 0.4 (inactive when RandAugment is on, as in
    timm), RandomErasing(p=0.25, pixel mode, one box); evaluation bicubic resize to ``img_size / 0.875`` then a
    centre crop to ``img_size``.

    Batches: ``(images float32 (B, 3, img_size, img_size), labels int64 (B,))``.

    Args:
        root: ImageFolder tree (see above); None loads ``hub_id`` from the Hugging Face Hub.
        hub_id: Hugging Face dataset id used when ``root`` is None.
        img_size: side of the (square) images fed to the model.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        root: Optional[str] = None,
        hub_id: str = "ILSVRC/imagenet-1k",
        img_size: int = 224,
        batch_size: int = 256,
        num_workers: int = 8,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        check_positive_int("img_size", img_size)
        self.root = root
        self.hub_id = hub_id
        self.img_size = img_size
        self.in_chans = 3
        self.data_dir = resolve_root(root)
        self.classes: Optional[list[str]] = None
        if self.data_dir is not None:
            self.classes = self._check_tree(self.data_dir)
        self.num_classes = IMAGENET_CLASSES if self.classes is None else len(self.classes)

    @staticmethod
    def _check_tree(data_dir: Path) -> list[str]:
        """Check ``data_dir/{train,val}`` exist and hold the same class folders; return the classes."""
        missing = [split for split in ("train", "val") if not (data_dir / split).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"ImageNet folder {str(data_dir)!r} has no {' or '.join(missing)} sub-folder. "
                f"Pass {flag('root')}={ROOT_HINT}, or omit it to use the Hugging Face Hub."
            )
        train_classes = _class_folders(data_dir / "train")
        val_classes = _class_folders(data_dir / "val")
        if not train_classes or not val_classes:
            empty = "train" if not train_classes else "val"
            raise FileNotFoundError(
                f"{str(data_dir / empty)!r} has no class sub-folders (images must sit in <split>/<class>/; the raw "
                f"ILSVRC val folder must be sorted into class folders first). Pass {flag('root')}={ROOT_HINT}."
            )
        if train_classes != val_classes:
            only_train = sorted(set(train_classes) - set(val_classes))[:5]
            only_val = sorted(set(val_classes) - set(train_classes))[:5]
            raise ValueError(
                f"{flag('root')}={str(data_dir)!r}: train and val must hold the same class folders, otherwise the "
                f"label indices disagree (only in train, first 5: {only_train}; only in val: {only_val})"
            )
        return train_classes

    def train_transform(self) -> Callable:
        """Training transform (timm/DeiT) at ``img_size``."""
        transform = create_transform(
            self.img_size,
            is_training=True,
            auto_augment="rand-m9-mstd0.5-inc1",
            interpolation="bicubic",
            re_prob=0.25,
            re_mode="pixel",
            re_count=1,
            color_jitter=0.4,
        )
        return _allow_zero_bit_posterize(transform)

    def eval_transform(self) -> Callable:
        """Evaluation transform (timm): bicubic resize to ``img_size / 0.875``, centre crop ``img_size``."""
        return create_transform(self.img_size, is_training=False, interpolation="bicubic", crop_pct=0.875)

    def prepare_data(self) -> None:
        """Download the Hub dataset into the Hugging Face cache (once per node); nothing to do with ``root``."""
        if self.data_dir is None:
            load_hub_dataset(self.hub_id, ROOT_HINT)

    def setup(self, stage: Optional[str] = None) -> None:
        """Build the training split (``fit`` only) and the validation split."""
        need_train = stage in (None, "fit")
        if self.val_set is not None and (self.train_set is not None or not need_train):
            return
        if self.data_dir is not None:
            self.val_set = ImageFolder(str(self.data_dir / "val"), transform=self.eval_transform())
            if need_train:
                self.train_set = ImageFolder(str(self.data_dir / "train"), transform=self.train_transform())
            return
        splits = load_hub_dataset(self.hub_id, ROOT_HINT)
        columns = ("image", "label")
        val = hub_split(splits, self.hub_id, "validation", columns, self.num_classes)
        self.val_set = HubImageDataset(val, *columns, transform=self.eval_transform())
        if need_train:
            train = hub_split(splits, self.hub_id, "train", columns, self.num_classes)
            self.train_set = HubImageDataset(train, *columns, transform=self.train_transform())
