"""scikit-learn's 8x8 handwritten digits: a tiny, offline dataset for smoke tests and quick experiments."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from layerwise.datamodules._base import ImageDataModule, flag

NUM_DIGITS = 1797
MAX_PIXEL = 16.0


class DigitsDataModule(ImageDataModule):
    """scikit-learn ``load_digits()``: 1797 grayscale 8x8 images of the digits 0-9, shipped with scikit-learn.

    Split: a fixed, stratified train/validation split (``train_test_split(stratify=labels, random_state=seed)``),
    so every class keeps its proportion in both parts; the same ``seed`` always gives the same split. The index
    lists are kept, sorted, in ``train_indices`` / ``val_indices`` (positions in ``load_digits()``).
    There is no separate test split: ``test_dataloader`` and ``predict_dataloader`` return the validation split
    (``test_split = "validation"``: ``layerwise test`` says so, and its summary records ``"split": "validation"``).

    Preprocessing: pixels 0..16 are divided by 16 to [0, 1], then standardised with one scalar mean and std
    computed over all pixels of the *training* split (exposed as ``mean`` / ``std`` after ``setup``), so no
    validation statistics leak into training. No augmentation.

    Batches: ``(images float32 (B, 1, 8, 8), labels int64 (B,))``.

    Distribution shift (``corrupted_val``): a second validation set, ``corrupted``, made of the same validation
    images, each rotated by an angle drawn uniformly from ``±corruption_rotation`` degrees (bilinear, zero fill) and
    given Gaussian pixel noise of standard deviation ``corruption_noise`` (pixels in [0, 1]), drawn once from
    ``seed``; ``val_dataloader`` then returns both and the analysis reports it as ``val_corrupted``.

    Task transfer (``classes``): keep only these digits, relabelled 0..k-1 in the given order (e.g. ``[0, 1, 2, 3,
    4]`` to pretrain, ``[5, 6, 7, 8, 9]`` to probe the frozen features on other classes).

    Args:
        batch_size: samples per batch.
        val_fraction: fraction of the images held out for validation, in (0, 1); both parts must contain at
            least one image per class (10 images each).
        seed: ``random_state`` of the split, and the seed of the corruption.
        num_workers: DataLoader worker processes (0 loads in the main process, the fastest for this size).
        corrupted_val: add the rotated and noisy validation set.
        corruption_rotation: largest rotation in degrees.
        corruption_noise: standard deviation of the pixel noise.
        classes: the digits to keep (None: all ten).
    """

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
        corrupted_val: bool = False,
        corruption_rotation: float = 15.0,
        corruption_noise: float = 0.1,
        classes: Optional[list[int]] = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"{flag('val_fraction')} must lie in (0, 1), got {val_fraction!r}")
        if classes is not None:
            if len(classes) < 2 or len(set(classes)) != len(classes) or any(c not in range(10) for c in classes):
                raise ValueError(f"{flag('classes')} must list at least two different digits 0-9, got {classes!r}")
        if corruption_rotation < 0 or corruption_noise < 0:
            raise ValueError(
                f"{flag('corruption_rotation')} and {flag('corruption_noise')} must be >= 0, got "
                f"{corruption_rotation!r} and {corruption_noise!r}"
            )
        self.corrupted_val = corrupted_val
        self.corruption_rotation = float(corruption_rotation)
        self.corruption_noise = float(corruption_noise)
        self.classes = None if classes is None else list(classes)
        n_val = math.ceil(val_fraction * NUM_DIGITS)  # train_test_split rounds the test part up
        if min(n_val, NUM_DIGITS - n_val) < 10:
            raise ValueError(
                f"{flag('val_fraction')}={val_fraction} leaves {n_val} validation and {NUM_DIGITS - n_val} training "
                "images; a stratified split needs at least 10 (one per class) in each"
            )
        self.val_fraction = val_fraction
        self.seed = seed
        self.num_classes = 10 if classes is None else len(classes)
        self.img_size = 8
        self.in_chans = 1
        self.mean: Optional[float] = None
        self.std: Optional[float] = None
        self.train_indices: Optional[np.ndarray] = None
        self.val_indices: Optional[np.ndarray] = None

    def setup(self, stage: Optional[str] = None) -> None:
        """Load the digits, split them and standardise with the training statistics (idempotent)."""
        if self.train_set is not None:
            return
        digits = load_digits()
        images = digits.images.astype(np.float32) / MAX_PIXEL
        labels = np.asarray(digits.target)
        if self.classes is not None:
            keep = np.isin(labels, self.classes)
            relabel = {digit: index for index, digit in enumerate(self.classes)}
            images, labels = images[keep], np.array([relabel[digit] for digit in labels[keep]])
        train_idx, val_idx = train_test_split(
            np.arange(len(labels)), test_size=self.val_fraction, stratify=labels, random_state=self.seed
        )
        self.train_indices, self.val_indices = np.sort(train_idx), np.sort(val_idx)
        train_pixels = images[self.train_indices]
        self.mean, self.std = float(train_pixels.mean()), float(train_pixels.std())
        x = torch.from_numpy((images - self.mean) / self.std).unsqueeze(1)
        y = torch.as_tensor(labels, dtype=torch.long)
        train, val = torch.from_numpy(self.train_indices), torch.from_numpy(self.val_indices)
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])
        if self.corrupted_val:
            corrupted = corrupt(
                torch.from_numpy(images[self.val_indices]), self.corruption_rotation, self.corruption_noise, self.seed
            )
            self.shifted_val_sets["corrupted"] = TensorDataset(
                ((corrupted - self.mean) / self.std).unsqueeze(1), y[val]
            )


def corrupt(images: torch.Tensor, max_degrees: float, noise: float, seed: int) -> torch.Tensor:
    """Rotate each (H, W) image in [0, 1] by a uniform angle in ±``max_degrees`` and add Gaussian noise ``noise``."""
    generator = torch.Generator().manual_seed(seed)
    angles = (torch.rand(images.shape[0], generator=generator) * 2 - 1) * math.radians(max_degrees)
    cos, sin = torch.cos(angles), torch.sin(angles)
    zeros = torch.zeros_like(angles)
    theta = torch.stack([torch.stack([cos, -sin, zeros], -1), torch.stack([sin, cos, zeros], -1)], 1)
    batch = images.unsqueeze(1)
    grid = torch.nn.functional.affine_grid(theta, list(batch.shape), align_corners=False)
    rotated = torch.nn.functional.grid_sample(batch, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return rotated.squeeze(1) + noise * torch.randn(images.shape, generator=generator)
