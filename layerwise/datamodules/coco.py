"""Object detection data in the COCO format (an ``instances_*.json`` and its image folder) for DETR."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch import LightningDataModule
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from layerwise.datamodules._base import check_positive_int, flag
from layerwise.datamodules._resumable import training_loader


class COCODetection(Dataset):
    """``(PIL image, {"image_id", "annotations"})`` per image of a COCO-format annotation file.

    The annotation file holds ``images`` (``id``, ``file_name``), ``annotations`` (``image_id``, ``bbox`` as
    ``[x, y, width, height]`` in pixels, ``category_id``, ``area``, ``iscrowd``) and ``categories`` (``id``,
    ``name``) — the format of COCO's ``instances_val2017.json``. Images without annotations are kept (DETR learns
    "no object" from them too). Category ids are used as class indices as they are, as DETR's COCO checkpoints
    do (COCO's ids run from 1 to 90; ``num_labels`` must exceed the largest id).
    """

    def __init__(self, images: str, annotations: str, option: str = "annotations") -> None:
        path = Path(annotations).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{flag(option)}={annotations!r}: no such COCO annotation file.")
        record = json.loads(path.read_text())
        missing = [key for key in ("images", "annotations", "categories") if key not in record]
        if missing:
            raise ValueError(f"{flag(option)}={annotations!r} is not in the COCO format: it lacks {missing}.")
        self.folder = Path(images).expanduser()
        self.images = sorted(record["images"], key=lambda image: image["id"])
        self.categories = {int(category["id"]): str(category["name"]) for category in record["categories"]}
        self.annotations: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for annotation in record["annotations"]:
            self.annotations[int(annotation["image_id"])].append(annotation)
        absent = [image["file_name"] for image in self.images[:3] if not (self.folder / image["file_name"]).is_file()]
        if absent:
            raise FileNotFoundError(f"COCO images {absent} are not in {str(self.folder)!r}: check the image folder.")

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Image.Image, dict[str, Any]]:
        image = self.images[index]
        pixels = Image.open(self.folder / image["file_name"]).convert("RGB")
        return pixels, {"image_id": int(image["id"]), "annotations": self.annotations.get(int(image["id"]), [])}


class DetectionCollate:
    """Batches pairs through a DETR image processor, with boxes in DETR's convention and COCO's ground truth kept.

    The batch: ``pixel_values``, ``pixel_mask`` and ``labels`` (a list of dicts with ``class_labels``, ``boxes``
    (cx, cy, w, h), ``orig_size``, ``size``, ..., and the evaluation ground truth ``eval_boxes``, ``eval_labels``,
    ``eval_iscrowd``, ``eval_area``).

    ``boxes`` are normalised to each image itself (its resized size, ``size``, read from ``pixel_mask``), as DETR
    predicts them and as its post-processing scales them: recent image processors normalise them to the padded batch
    image instead, so a box's coordinates would depend on which images share its batch. The ``eval_*`` entries are
    every annotation of the image as the file gives it — absolute (x0, y0, x1, y1) in the original pixels, crowd
    regions included (the processor drops them; COCO's evaluation ignores detections that match them).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, pairs: list[tuple[Image.Image, dict[str, Any]]]) -> dict[str, Any]:
        images, targets = zip(*pairs)
        encoded = self.processor(images=list(images), annotations=list(targets), return_tensors="pt")
        labels = list(encoded["labels"])
        mask = encoded.get("pixel_mask")
        for index, (label, target) in enumerate(zip(labels, targets)):
            if mask is not None:
                _normalise_to_own_image(label, mask[index])
            label.update(_evaluation_ground_truth(target["annotations"]))
        return {"pixel_values": encoded["pixel_values"], "pixel_mask": mask, "labels": labels}


def _normalise_to_own_image(label: dict[str, Any], mask: torch.Tensor) -> None:
    """Boxes normalised to ``label["size"]`` (the padded batch image) -> to the image's own resized size."""
    height, width = int(mask.any(dim=1).sum()), int(mask.any(dim=0).sum())
    normalised_to = label["size"].to(torch.float64)
    scale = torch.stack([normalised_to[1] / width, normalised_to[0] / height] * 2)
    label["boxes"] = (label["boxes"].to(torch.float64) * scale).to(label["boxes"].dtype)
    label["size"] = torch.tensor([height, width], dtype=label["size"].dtype)


def _evaluation_ground_truth(annotations: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """COCO annotations as torchmetrics' ``MeanAveragePrecision`` targets: xyxy pixels, labels, iscrowd, area."""
    boxes = torch.tensor([annotation["bbox"] for annotation in annotations], dtype=torch.float64).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]
    return {
        "eval_boxes": boxes.float(),
        "eval_labels": torch.tensor([int(a["category_id"]) for a in annotations], dtype=torch.long),
        "eval_iscrowd": torch.tensor([int(a.get("iscrowd", 0)) for a in annotations], dtype=torch.long),
        "eval_area": torch.tensor(
            [
                float(a["area"]) if "area" in a else float((b[2] - b[0]) * (b[3] - b[1]))
                for a, b in zip(annotations, boxes)
            ],
            dtype=torch.float32,
        ),
    }


class COCODetectionDataModule(LightningDataModule):
    """COCO-format detection data for DETR: training and validation annotation files with their image folders.

    The images go through the model's own image processor (``processor``: a hub id or folder, e.g.
    ``facebook/detr-resnet-50``; or ``processor_size`` to build a ``DetrImageProcessor`` offline with that shortest
    edge), which resizes, normalises, pads (``pixel_mask``) and converts the boxes.

    Args:
        val_annotations: the validation annotation file and image folder (COCO's
            ``annotations/instances_val2017.json`` and ``val2017/``).
        val_images: the validation annotation file and image folder (COCO's
            ``annotations/instances_val2017.json`` and ``val2017/``).
        train_annotations: the same for training (only ``fit`` needs them).
        train_images: the same for training (only ``fit`` needs them).
        processor: the image processor's hub id or folder; None builds a ``DetrImageProcessor``.
        processor_size: shortest edge of the built processor (its longest edge is 5/3 of it, as DETR's 800/1333).
        batch_size: images per batch.
        num_workers: DataLoader worker processes.
    """

    test_split = "validation"  # no test annotations: `layerwise test` evaluates the validation images and says so

    def __init__(
        self,
        val_annotations: str,
        val_images: str,
        train_annotations: Optional[str] = None,
        train_images: Optional[str] = None,
        processor: Optional[str] = None,
        processor_size: int = 800,
        batch_size: int = 4,
        num_workers: int = 2,
    ) -> None:
        super().__init__()
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_workers", num_workers, minimum=0)
        check_positive_int("processor_size", processor_size)
        if (train_annotations is None) != (train_images is None):
            raise ValueError(f"Give both {flag('train_annotations')} and {flag('train_images')}, or neither.")
        self.paths = dict(val=(val_images, val_annotations), train=(train_images, train_annotations))
        self.processor_name, self.processor_size = processor, processor_size
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_set: Optional[COCODetection] = None
        self.train_set: Optional[COCODetection] = None
        self.processor: Any = None

    def setup(self, stage: Optional[str] = None) -> None:
        """Read the annotation files and build the processor (idempotent)."""
        from transformers import AutoImageProcessor, DetrImageProcessor

        if self.processor is None:
            if self.processor_name is None:
                longest = round(self.processor_size * 5 / 3)
                self.processor = DetrImageProcessor(
                    size={"shortest_edge": self.processor_size, "longest_edge": longest}
                )
            else:
                self.processor = AutoImageProcessor.from_pretrained(self.processor_name)
        if self.val_set is None:
            self.val_set = COCODetection(*self.paths["val"], option="val_annotations")
        if stage in (None, "fit") and self.train_set is None:
            if self.paths["train"][1] is None:
                raise ValueError(f"Training needs {flag('train_annotations')} and {flag('train_images')}.")
            self.train_set = COCODetection(*self.paths["train"], option="train_annotations")

    def _loader(self, dataset: Optional[Dataset], train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("COCODetectionDataModule: call setup() first.")
        return (training_loader if train else DataLoader)(
            dataset,
            batch_size=self.batch_size,
            shuffle=train,
            num_workers=self.num_workers,
            collate_fn=DetectionCollate(self.processor),
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        """Training images, shuffled."""
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        """Validation images in file order."""
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        """The validation images."""
        return self._loader(self.val_set, train=False)
