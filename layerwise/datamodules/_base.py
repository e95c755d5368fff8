"""Shared plumbing for the datamodules: argument checks and dataloader construction."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from layerwise.datamodules._resumable import training_loader


def flag(arg: str) -> str:
    """The LightningCLI flag that sets datamodule argument ``arg``."""
    return f"--data.init_args.{arg}"


def check_positive_int(arg: str, value: int, minimum: int = 1) -> None:
    """Raise ValueError naming the CLI flag unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{flag(arg)} must be an integer >= {minimum}, got {value!r}")


def resolve_root(root: Optional[str]) -> Optional[Path]:
    """Expand ``~`` and make ``root`` absolute; None stays None."""
    return None if root is None else Path(root).expanduser().resolve()


def split_loader(
    dataset: Any, batch_size: int, num_workers: int, shuffle: bool, collate_fn: Optional[Callable] = None
) -> DataLoader:
    """The loader of one split: shuffled and resumable mid-epoch (:func:`training_loader`) for training, else in order.

    Every batch kept (``drop_last=False``), memory pinned on a CUDA machine, workers kept alive between epochs.
    """
    return (training_loader if shuffle else DataLoader)(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=False,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
    )


class ImageDataModule(LightningDataModule):
    """Base for the image datamodules: holds ``train_set``/``val_set`` and builds the dataloaders.

    Subclasses set ``num_classes``, ``img_size`` and ``in_chans`` in ``__init__`` and fill ``train_set`` (for
    ``fit``) and ``val_set`` in ``setup``. Train loader: shuffled, drop_last=False, resumable mid-epoch
    (:func:`~layerwise.datamodules._resumable.training_loader`); every other loader:
    shuffle=False, drop_last=False. ``test_dataloader`` and ``predict_dataloader`` return the validation split.
    Subclasses may add named validation sets under a distribution shift to ``shifted_val_sets`` in ``setup``.
    ``test_split`` names the split ``test_dataloader`` serves (recorded as ``split`` in a test summary).
    """

    test_split = "validation"
    num_classes: int
    img_size: int
    in_chans: int

    def __init__(self, batch_size: int, num_workers: int) -> None:
        super().__init__()
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_workers", num_workers, minimum=0)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_set: Optional[Dataset] = None
        self.val_set: Optional[Dataset] = None
        # more validation sets (a distribution shift next to the clean one): name -> dataset, filled in ``setup``
        self.shifted_val_sets: dict[str, Dataset] = {}

    def _loader(self, dataset: Optional[Dataset], split: str, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: the {split} split is not built; call setup() first")
        return split_loader(dataset, self.batch_size, self.num_workers, shuffle=train)

    def train_dataloader(self) -> DataLoader:
        """Training split, shuffled."""
        return self._loader(self.train_set, "train", train=True)

    def val_dataloader(self) -> Union[DataLoader, dict[str, DataLoader]]:
        """Validation split, in a fixed order; with shifted validation sets a dict ``{"validation": ..., name: ...}``.

        Lightning runs every loader of the dict in turn; the analysis callbacks and the modules report the first as
        ``val`` and every other one as ``val_<name>`` (:func:`layerwise.results.loader_stages`).
        """
        main = self._loader(self.val_set, "validation", train=False)
        if not self.shifted_val_sets:
            return main
        shifted = {name: self._loader(dataset, name, train=False) for name, dataset in self.shifted_val_sets.items()}
        return {"validation": main, **shifted}

    def test_dataloader(self) -> DataLoader:
        """The validation split (see the subclass docstring for what that split is)."""
        return self._loader(self.val_set, "validation", train=False)

    def predict_dataloader(self) -> DataLoader:
        """The validation split (see the subclass docstring for what that split is)."""
        return self._loader(self.val_set, "validation", train=False)
