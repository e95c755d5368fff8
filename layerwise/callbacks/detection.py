"""AP50 of every DETR decoder layer over the validation set (App. B.5, Fig. 18 of Jiang et al.)."""

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.features.outputs import DETECTION_LABELS as LABELS
from layerwise.features.outputs import LAYER_BOXES, LAYER_LOGITS
from layerwise.figures.summary import detection_figures
from layerwise.metrics.detection import cxcywh_to_xyxy, detections


class DetectionLayerAP(AnalysisCallback):
    """AP at IoU 0.5 of every decoder layer's predictions, with torchmetrics' ``MeanAveragePrecision``.

    Reads the per-layer predictions that :class:`~layerwise.lightning_modules.DetrLayerwise` returns from its
    validation step (no second forward pass); every query is a detection scored by its best non-background class
    (DETR's post-processing with threshold 0), boxes (normalised to each image, DETR's convention) scaled to the
    image's original size. The ground truth is the annotation file's own, crowd regions included, which
    :class:`~layerwise.datamodules.COCODetectionDataModule` passes along as ``eval_boxes``/``eval_labels``/
    ``eval_iscrowd``/``eval_area`` (without them: the processor's ``boxes``, which must then be normalised to the
    image itself, not to the padded batch). One ``MeanAveragePrecision(iou_thresholds=[0.5])`` per layer (COCO's
    101-point interpolation, pycocotools): the value equals pycocotools' ``COCOeval`` AP50 on the same detections,
    whatever the batch size; under DDP the detections are gathered (one ``all_gather_object`` in :meth:`compute`:
    COCO's AP is no sum of per-rank statistics) and the sampler's padding is dropped, so the value is the same on any
    number of processes. Only the first validation dataloader is analysed.

    Outputs: ``detection_ap50`` (L) in the epoch's summary JSON, scalars ``val/ap50/layer_XX``, a figure.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` always analyses).
        log_figures: draw AP50 per layer as an image in every logger (PNG files without one; global rank zero).
        figures_every_n_epochs: while fitting, draw it only every n-th epoch and at the last one.
    """

    key = "detection_ap50"
    figures = staticmethod(detection_figures)

    def __init__(self, every_n_epochs: int = 1, log_figures: bool = True, figures_every_n_epochs: int = 1) -> None:
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        self._kept: list[list[tuple[int, dict, dict]]] = []  # per layer: (image id, detections, ground truth)

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._kept = [[] for _ in range(int(pl_module.num_layers))]

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        labels = outputs[LABELS]
        rows = self.real_rows(len(labels))
        if rows == 0:
            return
        sizes = torch.stack([target["orig_size"] for target in labels[:rows]]).to(pl_module.device)
        targets = [_ground_truth(target) for target in labels[:rows]]
        ids = [int(target["image_id"]) for target in labels[:rows]]
        for kept, logits, boxes in zip(self._kept, outputs[LAYER_LOGITS], outputs[LAYER_BOXES]):
            found = detections(logits[:rows].float(), boxes[:rows].float(), sizes)
            found = [{key: value.cpu() for key, value in image.items()} for image in found]
            kept.extend(zip(ids, found, targets))

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> list[float]:
        kept, self._kept = self._kept, []
        if trainer.world_size > 1:  # a collective: every rank's images, in rank order
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, kept)
            kept = [[pair for rank in gathered for pair in rank[layer]] for layer in range(len(kept))]
        return [_ap50(pairs) for pairs in kept]

    def scalars(self, ap50: list[float]) -> dict[str, float]:
        width = max(2, len(str(len(ap50))))
        return {f"ap50/layer_{layer:0{width}d}": value for layer, value in enumerate(ap50, start=1)}

    def line(self, ap50: list[float]) -> str:
        return f"AP50 per decoder layer: {', '.join(f'{value:.3f}' for value in ap50)}"


def _ground_truth(label: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The image's ground truth for the COCO evaluation (xyxy pixels of the original image).

    The annotation file's own (crowd included) where the datamodule kept it (``eval_*``), else the processor's
    boxes, normalised to the image, scaled to its original size.
    """
    if "eval_boxes" in label:
        keys = ("boxes", "labels", "iscrowd", "area")
        return {key: label[f"eval_{key}"].cpu() for key in keys}
    boxes = cxcywh_to_xyxy(label["boxes"].float().cpu(), label["orig_size"].cpu())
    return {"boxes": boxes, "labels": label["class_labels"].cpu()}


def _ap50(pairs: list[tuple[int, dict, dict]]) -> float:
    """AP at IoU 0.5 of (image id, detections, ground truth), one per image, fed in image-id order.

    The order matters only for detections of equal score (the COCO evaluation sorts them stably); the image-id
    order makes the value independent of how the images were split over processes.
    """
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(iou_thresholds=[0.5], box_format="xyxy", sync_on_compute=False)
    for _, found, truth in sorted(pairs, key=lambda pair: pair[0]):
        metric.update([found], [truth])
    return float(metric.compute()["map_50"])
