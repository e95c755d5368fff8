"""Detections from DETR-style outputs, in the form torchmetrics' ``MeanAveragePrecision`` reads."""

import torch
from torch import Tensor


def cxcywh_to_xyxy(boxes: Tensor, sizes: Tensor) -> Tensor:
    """Normalised (cx, cy, w, h) boxes (..., 4) -> absolute (x0, y0, x1, y1) for image sizes (height, width)."""
    cx, cy, w, h = boxes.unbind(-1)
    corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)
    height, width = sizes.to(boxes.dtype).unbind(-1)
    scale = torch.stack([width, height, width, height], dim=-1)
    return corners * scale.view(*scale.shape[:-1], *([1] * (corners.ndim - scale.ndim)), 4)


def detections(logits: Tensor, boxes: Tensor, sizes: Tensor) -> list[dict[str, Tensor]]:
    """Every query as a scored detection: the best class except "no object" (the last logit) and its box.

    Args:
        logits: (B, Q, C + 1) class logits of one decoder layer.
        boxes: (B, Q, 4) normalised (cx, cy, w, h).
        sizes: (B, 2) the (height, width) the boxes are scaled to.

    Returns:
        One dict per image with ``boxes`` (Q, 4) xyxy, ``scores`` (Q,), ``labels`` (Q,), as DETR's own
        post-processing gives with threshold 0.
    """
    scores, labels = logits.softmax(-1)[..., :-1].max(-1)
    corners = cxcywh_to_xyxy(boxes, sizes)
    return [{"boxes": b, "scores": s, "labels": c} for b, s, c in zip(corners, scores, labels)]
