"""CIFAR-10 and CIFAR-100, from a local folder in the original Python-pickle format or from the Hugging Face Hub."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tv_datasets
from torchvision import transforms as T

from layerwise.datamodules._base import ImageDataModule, check_positive_int, flag, resolve_root
from layerwise.datamodules._hub import HubImageDataset, hub_split, load_hub_dataset

CIFAR_SIZE = 32


class _LocalFolder:
    """Lets a torchvision CIFAR dataset read a data folder whatever its name (torchvision hard-codes the name)."""

    def __init__(self, data_dir: Path, **kwargs: Any) -> None:
        self.base_folder = data_dir.name
        super().__init__(str(data_dir.parent), **kwargs)


class LocalCIFAR10(_LocalFolder, tv_datasets.CIFAR10):
    """torchvision CIFAR-10 reading ``data_dir`` (any name) with md5 verification and no download."""


class LocalCIFAR100(_LocalFolder, tv_datasets.CIFAR100):
    """torchvision CIFAR-100 reading ``data_dir`` (any name) with md5 verification and no download."""


class NpzImageDataset(Dataset):
    """Images and labels from an ``.npz`` file with ``images`` (N, H, W, 3) uint8 and ``labels`` (N,) integers.

    The release format of CIFAR-10.2 (Lu et al., 2020: ``cifar102_test.npz``, ``cifar102_train.npz``), a
    reproduction of CIFAR-10's test set used as a natural distribution shift.
    """

    def __init__(self, path: str, transform: Callable) -> None:
        with np.load(path, allow_pickle=False) as data:
            if "images" not in data or "labels" not in data:
                raise ValueError(f"{path}: expected the arrays 'images' and 'labels', found {sorted(data.files)}.")
            self.images, self.labels = data["images"], data["labels"].astype(np.int64)
        self.source = path  # named by the label check (layerwise.datamodules.labels.dataset_labels)
        if self.images.ndim != 4 or self.images.shape[-1] != 3 or len(self.images) != len(self.labels):
            raise ValueError(f"{path}: expected images (N, H, W, 3) and N labels, got {self.images.shape}.")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transform(Image.fromarray(self.images[index])), int(self.labels[index])


class _CIFARDataModule(ImageDataModule):
    """Shared implementation of :class:`CIFAR10DataModule` and :class:`CIFAR100DataModule`."""

    name: ClassVar[str]
    folder: ClassVar[str]  # the folder the official archive extracts to
    files: ClassVar[tuple[str, ...]]
    torchvision_class: ClassVar[Callable[..., tv_datasets.CIFAR10]]
    label_column: ClassVar[str]
    image_column: ClassVar[str] = "img"
    mean: ClassVar[tuple[float, float, float]]
    std: ClassVar[tuple[float, float, float]]
    classes: ClassVar[int]

    def __init__(
        self,
        root: Optional[str],
        hub_id: str,
        img_size: int,
        batch_size: int,
        num_workers: int,
        augment: bool,
        shifted_val: Optional[dict[str, str]] = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)
        check_positive_int("img_size", img_size)
        self.shifted_val = dict(shifted_val or {})
        for name, path in self.shifted_val.items():
            if not Path(path).expanduser().is_file():
                raise FileNotFoundError(
                    f"{flag('shifted_val')}: {name!r} -> {path!r} is not a file (an .npz with 'images' and 'labels', "
                    "e.g. CIFAR-10.2's cifar102_test.npz)."
                )
        self.root = root
        self.hub_id = hub_id
        self.augment = augment
        self.num_classes = self.classes
        self.img_size = img_size
        self.in_chans = 3
        self.data_dir = self._find_data_dir(resolve_root(root)) if root is not None else None

    @property
    def _root_hint(self) -> str:
        return f"/path/to/{self.folder}"

    def _find_data_dir(self, root: Path) -> Path:
        """The folder holding the pickle files: ``root`` itself or ``root/<official folder name>``."""
        for candidate in (root, root / self.folder):
            if all((candidate / name).is_file() for name in self.files):
                return candidate
        if not root.is_dir():
            raise FileNotFoundError(
                f"{self.name} folder {str(root)!r} does not exist. Pass {flag('root')}={self._root_hint} (the folder "
                f"extracted from the official python archive, or its parent), or omit it to load {self.hub_id!r} "
                "from the Hugging Face Hub."
            )
        data_dir = root / self.folder if (root / self.folder).is_dir() else root
        missing = [name for name in self.files if not (data_dir / name).is_file()]
        raise FileNotFoundError(
            f"{self.name} folder {str(data_dir)!r} lacks {missing} of the files {list(self.files)} (the original "
            f"Python-pickle format). Pass {flag('root')}={self._root_hint} or its parent."
        )

    def train_transform(self) -> Callable:
        """Training transform: RandomCrop(32, pad 4), flip, RandomRotation(15) (if ``augment``), resize, normalise."""
        if not self.augment:
            return self.eval_transform()
        augmentation = [T.RandomCrop(CIFAR_SIZE, padding=4), T.RandomHorizontalFlip(p=0.5), T.RandomRotation(15)]
        return T.Compose(augmentation + self._resize() + self._to_normalised_tensor())

    def eval_transform(self) -> Callable:
        """Evaluation transform: resize (only if ``img_size`` != 32), ToTensor, Normalize."""
        return T.Compose(self._resize() + self._to_normalised_tensor())

    def _resize(self) -> list[Any]:
        if self.img_size == CIFAR_SIZE:
            return []
        return [T.Resize((self.img_size, self.img_size), interpolation=T.InterpolationMode.BICUBIC, antialias=True)]

    def _to_normalised_tensor(self) -> list[Any]:
        return [T.ToTensor(), T.Normalize(self.mean, self.std)]

    def prepare_data(self) -> None:
        """Download the Hub dataset into the Hugging Face cache (once per node); nothing to do with ``root``."""
        if self.data_dir is None:
            load_hub_dataset(self.hub_id, self._root_hint)

    def setup(self, stage: Optional[str] = None) -> None:
        """Build the training split (``fit`` only) and the validation split (the official test split)."""
        need_train = stage in (None, "fit")
        if self.val_set is not None and (self.train_set is not None or not need_train):
            return
        if self.data_dir is None:
            splits = load_hub_dataset(self.hub_id, self._root_hint)
            columns = (self.image_column, self.label_column)

            def build(split: str, transform: Callable) -> HubImageDataset:
                dataset = hub_split(splits, self.hub_id, split, columns, self.num_classes)
                return HubImageDataset(dataset, self.image_column, self.label_column, transform)

        else:

            def build(split: str, transform: Callable) -> tv_datasets.CIFAR10:
                return self._local_split(train=split == "train", transform=transform)

        self.val_set = build("test", self.eval_transform())
        for name, path in self.shifted_val.items():
            self.shifted_val_sets[name] = self._shifted_dataset(name, path)
        if need_train:
            self.train_set = build("train", self.train_transform())

    def _shifted_dataset(self, name: str, path: str) -> NpzImageDataset:
        """The shifted validation set ``name`` from ``path``, with the evaluation transform."""
        return NpzImageDataset(str(Path(path).expanduser()), self.eval_transform())

    def _local_split(self, train: bool, transform: Callable) -> tv_datasets.CIFAR10:
        assert self.data_dir is not None
        try:
            return self.torchvision_class(self.data_dir, train=train, transform=transform, download=False)
        except RuntimeError as err:  # torchvision checks every file's md5 against the official archive
            raise RuntimeError(
                f"{self.name} files in {str(self.data_dir)!r} do not match the official archive (md5 check failed: "
                f"{err}). Pass {flag('root')}={self._root_hint} pointing to an intact copy."
            ) from err


class CIFAR10DataModule(_CIFARDataModule):
    """CIFAR-10: 60000 RGB 32x32 images in 10 classes (50000 train, 10000 test).

    Source: with ``root``, a local ``cifar-10-batches-py`` folder as extracted from the official python archive
    (``data_batch_1``..``data_batch_5``, ``test_batch``, ``batches.meta``; pass the folder or its parent), read by
    ``torchvision.datasets.CIFAR10(download=False)``, which also verifies each file's md5. Without ``root``, the Hub
    dataset ``hub_id`` (columns "img", "label"; splits "train", "test") via ``datasets.load_dataset`` in
    ``prepare_data``/``setup``; an unreachable Hub raises ``ConnectionError`` within seconds.

    Splits: training = the 50000 official training images; validation = the official 10000-image test split.
    ``test_dataloader`` and ``predict_dataloader`` return that same official test split.

    Transforms: training (``augment=True``) RandomCrop(32, padding=4), RandomHorizontalFlip(0.5),
    RandomRotation(15), then a bicubic Resize to ``img_size`` if it differs from 32, ToTensor, Normalize with the
    CIFAR-10 training-set mean/std; evaluation (and training with ``augment=False``) the same without the three
    random ops.

    Batches: ``(images float32 (B, 3, img_size, img_size), labels int64 (B,))``.

    Args:
        root: local data folder (see above); None loads ``hub_id`` from the Hugging Face Hub.
        hub_id: Hugging Face dataset id used when ``root`` is None.
        img_size: side of the returned images; 32 keeps the native size, e.g. 224 upsamples for ImageNet-size ViTs.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes.
        augment: apply the random training augmentation.
        shifted_val: more validation sets under a distribution shift, name -> ``.npz`` file with ``images``
            (N, 32, 32, 3) uint8 and ``labels`` (CIFAR-10.2's release format, e.g. ``{"cifar10.2":
            "/data/cifar102_test.npz"}``), with the evaluation transform; reported as ``val_<name>``.
    """

    name = "CIFAR-10"
    folder = "cifar-10-batches-py"
    files = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
    torchvision_class = LocalCIFAR10
    label_column = "label"
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    classes = 10

    def __init__(
        self,
        root: Optional[str] = None,
        hub_id: str = "uoft-cs/cifar10",
        img_size: int = 32,
        batch_size: int = 256,
        num_workers: int = 8,
        augment: bool = True,
        shifted_val: Optional[dict[str, str]] = None,
    ) -> None:
        super().__init__(root, hub_id, img_size, batch_size, num_workers, augment, shifted_val)


class CIFAR100DataModule(_CIFARDataModule):
    """CIFAR-100: 60000 RGB 32x32 images in 100 fine classes (50000 train, 10000 test).

    Source: with ``root``, a local ``cifar-100-python`` folder as extracted from the official python archive
    (``train``, ``test``, ``meta``; pass the folder or its parent), read by
    ``torchvision.datasets.CIFAR100(download=False)``, which also verifies each file's md5; labels are the 100 fine
    labels. Without ``root``, the Hub dataset ``hub_id`` (columns "img", "fine_label"; splits "train", "test") via
    ``datasets.load_dataset`` in ``prepare_data``/``setup``; an unreachable Hub raises ``ConnectionError`` within
    seconds.

    Splits: training = the 50000 official training images; validation = the official 10000-image test split.
    ``test_dataloader`` and ``predict_dataloader`` return that same official test split.

    Transforms: as :class:`CIFAR10DataModule`, normalised with the CIFAR-100 training-set mean/std.

    Batches: ``(images float32 (B, 3, img_size, img_size), labels int64 (B,))``.

    Args:
        root: local data folder (see above); None loads ``hub_id`` from the Hugging Face Hub.
        hub_id: Hugging Face dataset id used when ``root`` is None.
        img_size: side of the returned images; 32 keeps the native size, e.g. 224 upsamples for ImageNet-size ViTs.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes.
        augment: apply the random training augmentation.
    """

    name = "CIFAR-100"
    folder = "cifar-100-python"
    files = ("train", "test", "meta")
    torchvision_class = LocalCIFAR100
    label_column = "fine_label"
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    classes = 100

    def __init__(
        self,
        root: Optional[str] = None,
        hub_id: str = "uoft-cs/cifar100",
        img_size: int = 32,
        batch_size: int = 256,
        num_workers: int = 8,
        augment: bool = True,
    ) -> None:
        super().__init__(root, hub_id, img_size, batch_size, num_workers, augment)
