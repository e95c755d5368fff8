"""Datamodules: digits split, CIFAR pickle folders, ImageFolder trees, and the Hugging Face Hub path (offline)."""

from __future__ import annotations

import os
import pickle
import socket
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import torchvision.datasets.cifar as tv_cifar
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule
from PIL import Image
from torchvision.transforms import functional as TF

from layerwise import hub
from layerwise.datamodules import CIFAR10DataModule, CIFAR100DataModule, DigitsDataModule, ImageNetDataModule

ROOT_FLAG = "--data.init_args.root"

# ----------------------------------------------------------------------------------------------------- digits


def test_digits_attributes_before_setup():
    dm = DigitsDataModule()
    assert (dm.num_classes, dm.img_size, dm.in_chans) == (10, 8, 1)
    assert dm.train_set is None


@pytest.mark.parametrize("val_fraction", [0.2, 0.35])
def test_digits_split_is_stratified_disjoint_and_covering(val_fraction):
    dm = DigitsDataModule(val_fraction=val_fraction, seed=3)
    dm.setup("fit")
    train_idx, val_idx = dm.train_indices, dm.val_indices
    assert len(np.intersect1d(train_idx, val_idx)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, val_idx])), np.arange(1797))
    assert len(val_idx) == int(np.ceil(val_fraction * 1797))

    labels = dm.val_set.tensors[1].numpy()
    all_counts = np.bincount(np.concatenate([dm.train_set.tensors[1].numpy(), labels]), minlength=10)
    expected = len(val_idx) * all_counts / all_counts.sum()
    assert np.all(np.abs(np.bincount(labels, minlength=10) - expected) <= 1.0)


def test_digits_split_is_deterministic_per_seed():
    def val_indices(seed):
        dm = DigitsDataModule(seed=seed)
        dm.setup()
        return dm.val_indices

    np.testing.assert_array_equal(val_indices(0), val_indices(0))
    assert not np.array_equal(val_indices(0), val_indices(1))


def test_digits_batches_shapes_dtypes_and_normalisation():
    dm = DigitsDataModule(batch_size=100)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (100, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (100,) and labels.dtype == torch.long
    train_images = dm.train_set.tensors[0]
    assert abs(train_images.mean().item()) < 1e-4 and abs(train_images.std().item() - 1) < 1e-3

    val_batches = list(dm.val_dataloader())
    assert sum(len(y) for _, y in val_batches) == len(dm.val_indices)  # drop_last=False
    first_again = next(iter(dm.val_dataloader()))[1]
    torch.testing.assert_close(val_batches[0][1], first_again)  # not shuffled
    torch.testing.assert_close(next(iter(dm.test_dataloader()))[1], first_again)  # test = validation split


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, -0.1, 1.5, 0.001, 0.999])
def test_digits_rejects_bad_val_fraction(val_fraction):
    with pytest.raises(ValueError, match="--data.init_args.val_fraction"):
        DigitsDataModule(val_fraction=val_fraction)


def test_bad_batch_size_names_the_flag():
    with pytest.raises(ValueError, match="--data.init_args.batch_size"):
        DigitsDataModule(batch_size=0)


def test_lightning_cli_style_class_path_parsing():
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningDataModule, "data")
    cfg = parser.parse_args(
        ["--data.class_path", "layerwise.datamodules.DigitsDataModule", "--data.init_args.val_fraction", "0.25"]
    )
    dm = parser.instantiate_classes(cfg).data
    assert isinstance(dm, DigitsDataModule) and dm.val_fraction == 0.25


# ------------------------------------------------------------------------------------------------------ CIFAR

CIFAR_SPECS = {
    # class, official folder name, {file: number of images}, label key in the pickles, meta file, meta key
    "cifar10": (
        CIFAR10DataModule,
        "cifar-10-batches-py",
        {**{f"data_batch_{i}": 2 for i in range(1, 6)}, "test_batch": 3},
        "labels",
        "batches.meta",
        "label_names",
    ),
    "cifar100": (CIFAR100DataModule, "cifar-100-python", {"train": 10, "test": 3}, "fine_labels", "meta", None),
}


def write_cifar(parent: Path, family: str, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write a tiny CIFAR folder in the original pickle layout; return {file: (uint8 HWC images, labels)}."""
    _, folder, files, label_key, meta_file, meta_key = CIFAR_SPECS[family]
    num_classes = 10 if family == "cifar10" else 100
    rng = np.random.default_rng(seed)
    data_dir = parent / folder
    data_dir.mkdir(parents=True)
    written = {}
    for name, n in files.items():
        rows = rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)  # channel-major rows, as in the archive
        labels = [int(v) for v in rng.integers(0, num_classes, size=n)]
        entry = {
            "batch_label": name,
            "data": rows,
            label_key: labels,
            "filenames": [f"{name}_{i}.png" for i in range(n)],
        }
        if family == "cifar100":
            entry["coarse_labels"] = [label // 5 for label in labels]
        with open(data_dir / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)
        written[name] = (rows.reshape(n, 3, 32, 32).transpose(0, 2, 3, 1), labels)
    meta = (
        {meta_key: [f"class_{i}" for i in range(10)], "num_cases_per_batch": 2, "num_vis": 3072}
        if family == "cifar10"
        else {
            "fine_label_names": [f"fine_{i}" for i in range(100)],
            "coarse_label_names": [f"c_{i}" for i in range(20)],
        }
    )
    with open(data_dir / meta_file, "wb") as f:
        pickle.dump(meta, f, protocol=2)
    return written


@pytest.fixture
def skip_md5(monkeypatch):
    """The tiny fixture files cannot match the official md5 sums that torchvision verifies."""
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


def normalised(images_hwc: np.ndarray, dm) -> torch.Tensor:
    """Reference eval transform for native-size CIFAR: to [0, 1], CHW, per-channel standardise."""
    x = torch.from_numpy(images_hwc).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(dm.mean).view(1, 3, 1, 1)) / torch.tensor(dm.std).view(1, 3, 1, 1)


@pytest.mark.parametrize("family", ["cifar10", "cifar100"])
@pytest.mark.parametrize("point_at", ["folder", "parent"])
def test_cifar_local_folder_loads(tmp_path, skip_md5, family, point_at):
    cls, folder = CIFAR_SPECS[family][:2]
    written = write_cifar(tmp_path, family)
    root = tmp_path / folder if point_at == "folder" else tmp_path
    dm = cls(root=str(root), batch_size=4, num_workers=0)
    assert (dm.num_classes, dm.img_size, dm.in_chans) == ((10 if family == "cifar10" else 100), 32, 3)
    dm.setup("fit")
    assert len(dm.train_set) == 10 and len(dm.val_set) == 3

    test_images, test_labels = written["test_batch" if family == "cifar10" else "test"]
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.long and labels.tolist() == test_labels
    torch.testing.assert_close(images, normalised(test_images, dm))  # validation = official test split, no aug

    train_labels = sorted(
        label for name, (_, labs) in written.items() if name not in ("test_batch", "test") for label in labs
    )
    all_train = torch.cat([y for _, y in dm.train_dataloader()])
    assert sorted(all_train.tolist()) == train_labels and all_train.dtype == torch.long


def test_cifar_augmentation_only_on_train(tmp_path, skip_md5):
    written = write_cifar(tmp_path, "cifar10")
    dm = CIFAR10DataModule(root=str(tmp_path), num_workers=0)
    dm.setup("fit")
    raw_first = normalised(written["data_batch_1"][0][:1], dm)[0]
    draws = []
    for seed in range(3):
        torch.manual_seed(seed)
        draws.append(dm.train_set[0][0])
    assert not torch.allclose(draws[0], draws[1]) or not torch.allclose(draws[1], draws[2])
    assert not all(torch.allclose(d, raw_first) for d in draws)
    torch.manual_seed(0)
    first = dm.val_set[0][0]
    torch.manual_seed(1)
    torch.testing.assert_close(dm.val_set[0][0], first)

    plain = CIFAR10DataModule(root=str(tmp_path), num_workers=0, augment=False)
    plain.setup("fit")
    torch.testing.assert_close(plain.train_set[0][0], raw_first)


def test_cifar_img_size_resizes_both_splits(tmp_path, skip_md5):
    write_cifar(tmp_path, "cifar100")
    dm = CIFAR100DataModule(root=str(tmp_path), img_size=48, batch_size=2, num_workers=0)
    assert dm.img_size == 48
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))[0].shape == (2, 3, 48, 48)
    assert next(iter(dm.val_dataloader()))[0].shape == (2, 3, 48, 48)


def test_cifar_renamed_folder_and_validate_stage(tmp_path, skip_md5):
    write_cifar(tmp_path, "cifar10")
    renamed = tmp_path / "my-cifar"
    (tmp_path / "cifar-10-batches-py").rename(renamed)
    dm = CIFAR10DataModule(root=str(renamed), num_workers=0)
    dm.setup("validate")
    assert dm.train_set is None and len(dm.val_set) == 3


@pytest.mark.parametrize("family", ["cifar10", "cifar100"])
def test_cifar_missing_or_incomplete_folder(tmp_path, family):
    cls, folder = CIFAR_SPECS[family][:2]
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG):
        cls(root=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG):
        cls(root=str(tmp_path))  # exists, but holds nothing
    write_cifar(tmp_path, family)
    (tmp_path / folder / ("test_batch" if family == "cifar10" else "test")).unlink()
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG) as excinfo:
        cls(root=str(tmp_path))
    assert "lacks ['test" in str(excinfo.value)


def test_cifar_md5_mismatch_names_the_flag(tmp_path):
    write_cifar(tmp_path, "cifar10")
    dm = CIFAR10DataModule(root=str(tmp_path), num_workers=0)
    with pytest.raises(RuntimeError, match=ROOT_FLAG):
        dm.setup("fit")


# ------------------------------------------------------------------------------------- Hugging Face Hub path


@pytest.fixture
def online_mode(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def fail_if_called(*args, **kwargs):
    raise AssertionError("load_dataset must not be called when the Hub is unreachable")


@pytest.mark.parametrize("cls", [CIFAR10DataModule, CIFAR100DataModule, ImageNetDataModule])
def test_hub_unreachable_fails_at_once(monkeypatch, online_mode, cls):
    monkeypatch.setattr(hub, "hub_endpoint", closed_port_url)
    monkeypatch.setattr(datasets, "load_dataset", fail_if_called)
    dm = cls(num_workers=0)
    for hook in (dm.prepare_data, dm.setup):
        start = time.perf_counter()
        with pytest.raises(ConnectionError, match=ROOT_FLAG):
            hook()
        assert time.perf_counter() - start < 3.0


def test_hub_probe_deadline_when_server_never_answers(monkeypatch, online_mode):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()  # the kernel completes the handshake, nobody ever replies
    monkeypatch.setattr(hub, "hub_endpoint", lambda: f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(hub, "PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(datasets, "load_dataset", fail_if_called)
    try:
        start = time.perf_counter()
        with pytest.raises(ConnectionError, match=ROOT_FLAG):
            CIFAR10DataModule(num_workers=0).prepare_data()
        assert time.perf_counter() - start < 2.0
    finally:
        server.close()


def test_hub_offline_mode_cache_miss_fails_at_once(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    dm = CIFAR10DataModule(hub_id="layerwise-tests/never-cached", num_workers=0)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=ROOT_FLAG):
        dm.prepare_data()
    assert time.perf_counter() - start < 3.0


def test_hub_missing_or_gated_dataset_names_the_flag(monkeypatch):
    def gated(hub_id):
        raise datasets.exceptions.DatasetNotFoundError(f"Dataset '{hub_id}' is a gated dataset on the Hub.")

    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: None)
    monkeypatch.setattr(datasets, "load_dataset", gated)
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG):
        ImageNetDataModule(num_workers=0).setup("validate")


def rgb_images(n: int, size: int, seed: int, mode: str = "RGB") -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).convert(mode) for _ in range(n)]


def hub_dict(splits: dict[str, int], image_col: str, label_cols: dict[str, int], size: int = 32, modes=("RGB",)):
    """An in-memory DatasetDict shaped like the Hub dataset: PIL image column + ClassLabel column(s)."""
    features = datasets.Features(
        {image_col: datasets.Image(), **{col: datasets.ClassLabel(num_classes=k) for col, k in label_cols.items()}}
    )
    out = {}
    for i, (split, n) in enumerate(splits.items()):
        images = [img.convert(modes[j % len(modes)]) for j, img in enumerate(rgb_images(n, size, seed=i))]
        columns = {image_col: images, **{col: [(7 * j + 3) % k for j in range(n)] for col, k in label_cols.items()}}
        out[split] = datasets.Dataset.from_dict(columns, features=features)
    return datasets.DatasetDict(out)


@pytest.fixture
def fake_hub(monkeypatch):
    """Route ``datasets.load_dataset`` to an in-memory DatasetDict and record the requested ids."""
    requested: list[str] = []

    def install(dataset_dict):
        def load_dataset(hub_id):
            requested.append(hub_id)
            return dataset_dict

        monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url: None)
        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return requested

    return install


@pytest.mark.parametrize(
    ("cls", "label_cols", "hub_id"),
    [
        (CIFAR10DataModule, {"label": 10}, "uoft-cs/cifar10"),
        (CIFAR100DataModule, {"fine_label": 100, "coarse_label": 20}, "uoft-cs/cifar100"),
    ],
)
def test_cifar_hub_columns(fake_hub, online_mode, cls, label_cols, hub_id):
    requested = fake_hub(hub_dict({"train": 6, "test": 5}, "img", label_cols))
    dm = cls(batch_size=8, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert requested == [hub_id, hub_id]
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.long
    label_col = next(iter(label_cols))
    k = label_cols[label_col]
    assert labels.tolist() == [(7 * j + 3) % k for j in range(5)]
    expected = TF.normalize(TF.to_tensor(rgb_images(1, 32, seed=1)[0]), dm.mean, dm.std)
    torch.testing.assert_close(images[0], expected)
    assert len(dm.train_set) == 6 and next(iter(dm.train_dataloader()))[0].shape == (6, 3, 32, 32)


def test_hub_wrong_columns_or_class_count_name_hub_id(fake_hub, online_mode):
    fake_hub(hub_dict({"train": 2, "test": 2}, "image", {"label": 10}))
    with pytest.raises(ValueError, match=r"--data.init_args.hub_id.*\['img'\]"):
        CIFAR10DataModule(num_workers=0).setup("fit")
    fake_hub(hub_dict({"train": 2, "test": 2}, "img", {"fine_label": 10}))
    with pytest.raises(ValueError, match=r"--data.init_args.hub_id.*10 classes"):
        CIFAR100DataModule(num_workers=0).setup("fit")


def test_imagenet_hub_columns_and_grayscale(fake_hub, online_mode):
    requested = fake_hub(
        hub_dict({"train": 4, "validation": 3, "test": 2}, "image", {"label": 1000}, size=40, modes=("RGB", "L"))
    )
    dm = ImageNetDataModule(img_size=24, batch_size=4, num_workers=0)
    assert dm.num_classes == 1000
    dm.setup("fit")
    assert requested == ["ILSVRC/imagenet-1k"]
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (3, 3, 24, 24) and labels.tolist() == [3, 10, 17]
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 24, 24) and images.dtype == torch.float32 and labels.dtype == torch.long


# ------------------------------------------------------------------------------------------ ImageFolder tree


def write_tree(root: Path, classes=("n01", "n02", "n03"), per_class: int = 2, val_classes=None) -> None:
    for split, names in (("train", classes), ("val", val_classes or classes)):
        for c, name in enumerate(names):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i, image in enumerate(rgb_images(per_class, 20 + 4 * c, seed=c)):
                image.save(folder / (f"{i}.JPEG" if i % 2 else f"{i}.png"))


def test_imagenet_folder_tree(tmp_path):
    write_tree(tmp_path)
    dm = ImageNetDataModule(root=str(tmp_path), img_size=16, batch_size=16, num_workers=0)
    assert (dm.num_classes, dm.img_size, dm.in_chans) == (3, 16, 3)
    dm.setup("validate")
    assert dm.train_set is None
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (6, 3, 16, 16) and images.dtype == torch.float32
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (6, 3, 16, 16) and sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]


def test_imagenet_randaugment_survives_maximal_posterize():
    # m9 + mstd0.5 reaches the clip at magnitude 10, where PosterizeIncreasing asks Pillow to keep 0 bits
    transform = ImageNetDataModule(img_size=16, num_workers=0).train_transform()
    rand_augment = next(step for step in transform.transforms if hasattr(step, "ops"))
    posterize = next(op for op in rand_augment.ops if op.name == "PosterizeIncreasing")
    posterize.prob, posterize.magnitude, posterize.magnitude_std = 1.0, 10, 0
    out = posterize(rgb_images(1, 16, seed=0)[0])
    assert np.asarray(out).max() == 0


def test_imagenet_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG):
        ImageNetDataModule(root=str(tmp_path))  # no train/ or val/
    write_tree(tmp_path / "mismatch", val_classes=("n01", "n02"))
    with pytest.raises(ValueError, match=ROOT_FLAG):
        ImageNetDataModule(root=str(tmp_path / "mismatch"))
    flat = tmp_path / "flat"
    write_tree(flat)
    for folder in (flat / "val").iterdir():
        for image in folder.iterdir():
            image.rename(flat / "val" / f"{folder.name}_{image.name}")
        folder.rmdir()
    with pytest.raises(FileNotFoundError, match=ROOT_FLAG):
        ImageNetDataModule(root=str(flat))
