"""AP50 of every DETR decoder layer over the validation set (App. B.5, Fig. 18 of Jiang et al.)."""

from typing import Any, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from layerwise.callbacks._drawing import wait_for_figures
from layerwise.callbacks._output import _log_dir, _run_id, log_figures_later, show
from layerwise.callbacks._sampling import evaluation_loaders, real_samples_on_rank, take_real
from layerwise.callbacks._schedule import analyses_now
from layerwise.features.outputs import DETECTION_LABELS as LABELS
from layerwise.features.outputs import LAYER_BOXES, LAYER_LOGITS
from layerwise.metrics.detection import cxcywh_to_xyxy, detections
from layerwise.results import merge_summary, summary_path


class DetectionLayerAP(Callback):
    """AP at IoU 0.5 of every decoder layer's predictions, with torchmetrics' ``MeanAveragePrecision``.

    Reads the per-layer predictions that :class:`~layerwise.lightning_modules.DetrLayerwise` returns from its
    validation step (no second forward pass); every query is a detection scored by its best non-background class
    (DETR's post-processing with threshold 0), boxes (normalised to each image, DETR's convention) scaled to the
    image's original size. The ground truth is the annotation file's own, crowd regions included, which
    :class:`~layerwise.datamodules.COCODetectionDataModule` passes along as ``eval_boxes``/``eval_labels``/
    ``eval_iscrowd``/``eval_area`` (without them: the processor's ``boxes``, which must then be normalised to the
    image itself, not to the padded batch). One ``MeanAveragePrecision(iou_thresholds=[0.5])`` per layer (COCO's
    101-point interpolation, pycocotools): the value equals pycocotools' ``COCOeval`` AP50 on the same detections,
    whatever the batch size; under DDP the detections are gathered and the sampler's padding is dropped, so the
    value is the same on any number of processes.

    Outputs: ``detection_ap50`` (L) in the epoch's summary JSON, scalars ``val/ap50/layer_XX``, a figure.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` always analyses).
        log_figures: draw AP50 per layer as a TensorBoard image (global rank zero).
    """

    def __init__(self, every_n_epochs: int = 1, log_figures: bool = True) -> None:
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs={every_n_epochs!r}` must be a positive int.")
        self.every_n_epochs = every_n_epochs
        self.log_figures = log_figures
        self._kept: list[list[tuple[int, dict, dict]]] = []  # per layer: (image id, detections, ground truth)
        self._active = False
        self._budget: Optional[int] = None

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._active = analyses_now(trainer, self.every_n_epochs)
        if not self._active:
            return
        self._kept = [[] for _ in range(int(pl_module.num_layers))]
        loaders = trainer.val_dataloaders
        self._budget = real_samples_on_rank(evaluation_loaders(loaders)[0])

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._active or dataloader_idx != 0:
            return
        labels = outputs[LABELS]
        rows, self._budget = take_real(self._budget, len(labels))
        if rows == 0:
            return
        sizes = torch.stack([target["orig_size"] for target in labels[:rows]]).to(pl_module.device)
        targets = [_ground_truth(target) for target in labels[:rows]]
        ids = [int(target["image_id"]) for target in labels[:rows]]
        for kept, logits, boxes in zip(self._kept, outputs[LAYER_LOGITS], outputs[LAYER_BOXES]):
            found = detections(logits[:rows].float(), boxes[:rows].float(), sizes)
            found = [{key: value.cpu() for key, value in image.items()} for image in found]
            kept.extend(zip(ids, found, targets))

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self._active = False
        kept = self._kept
        if trainer.world_size > 1:  # a collective: every rank's images, in rank order
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, kept)
            kept = [[pair for rank in gathered for pair in rank[layer]] for layer in range(len(kept))]
        ap50 = [_ap50(pairs) for pairs in kept]
        width = max(2, len(str(len(ap50))))
        scalars = {f"val/ap50/layer_{layer:0{width}d}": value for layer, value in enumerate(ap50, start=1)}
        pl_module.log_dict(scalars, sync_dist=False, add_dataloader_idx=False)
        log_dir = _log_dir(trainer)
        if trainer.is_global_zero:
            header = {"stage": "val", "epoch": trainer.current_epoch, "global_step": trainer.global_step}
            path = summary_path(log_dir, "val", trainer.current_epoch, trainer.global_step)
            merge_summary(path, {**header, "detection_ap50": ap50}, _run_id(trainer))
            show(trainer, f"AP50 per decoder layer: {', '.join(f'{value:.3f}' for value in ap50)} → {path}")
            if self.log_figures:
                from layerwise.figures.summary import ap50_per_layer

                log_figures_later(trainer, lambda: {"val/detection_ap50": ap50_per_layer(ap50)})
        self._kept = []

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wait_for_figures()  # figures already enqueued reach the logger before Lightning closes it


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
