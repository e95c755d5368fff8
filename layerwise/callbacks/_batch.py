"""One evaluation step's outputs -> the selected layers' :class:`LayerBatch`, without the sampler's padding."""

from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
from torch import Tensor

from layerwise.callbacks.family import LayerBatch
from layerwise.features import (
    EXIT_LOGITS,
    EXIT_PREFIX,
    FEATURES,
    LOGITS,
    MAX_PROB,
    NLL,
    POSITIONS,
    PREDICTIONS,
    SAMPLE_INDEX,
    TARGETS,
    check_layer_outputs,
    is_layer_outputs,
)
from layerwise.metrics import Readout, readout_from_logits


def layer_batch(outputs: Any, selection: Tensor, budget: Optional[int], token_stride: int) -> tuple[LayerBatch, int]:
    """The :class:`LayerBatch` of a step's per-layer outputs and the dataloader samples it used (0 without a budget).

    ``budget`` is how many real samples this rank still has (``None``: no padding to drop); ``selection`` the
    0-based layers to keep; ``token_stride`` subsamples positions for the feature-similarity statistics.
    """
    if not is_layer_outputs(outputs):
        raise TypeError(
            "The validation/test step returned no per-layer outputs (a dict with 'features' and 'logits'). "
            "Use a layerwise LightningModule, return that dict, or pass source='hooks' (with blocks=, "
            "final_norm=, classifier= for models outside the built-in path table)."
        )
    check_layer_outputs(outputs)
    rows = _real_rows(outputs, budget)
    # Counted only against a budget: for a language model the count reads the device (the largest sample index),
    # which would stall the host once per batch.
    used = _samples_in(outputs, rows) if budget is not None else 0
    selection = selection.to(outputs[FEATURES].device)

    def pick(value: Optional[Tensor]) -> Optional[Tensor]:
        return None if value is None else value.index_select(0, selection)[:, rows]

    targets = outputs.get(TARGETS)
    targets = None if targets is None else targets[rows]
    readout = _readout(outputs, "", targets, pick)
    exit_readout = _readout(outputs, EXIT_PREFIX, targets, pick)
    positions = outputs.get(POSITIONS)
    sampled = None
    if positions is not None and token_stride > 1:
        sampled = torch.nonzero(positions[rows] % token_stride == 0).flatten()
    return LayerBatch(pick(outputs[FEATURES]), readout, targets, exit_readout, sampled), used


def _real_rows(outputs: Mapping, budget: Optional[int]) -> Union[slice, Tensor]:
    """The rows of a step's outputs that belong to real samples (``DistributedSampler`` pads at the end)."""
    if budget is None:
        return slice(None)
    sample_index = outputs.get(SAMPLE_INDEX)
    if sample_index is None:
        return slice(0, budget)
    return torch.nonzero(sample_index < budget).flatten()


def _samples_in(outputs: Mapping, rows: Union[slice, Tensor]) -> int:
    """How many dataloader samples the kept rows cover (a language model's sequence has many rows)."""
    sample_index = outputs.get(SAMPLE_INDEX)
    if sample_index is None:
        return len(range(*rows.indices(outputs[FEATURES].shape[1]))) if isinstance(rows, slice) else rows.numel()
    kept = sample_index[rows]
    return 0 if kept.numel() == 0 else int(kept.max()) + 1


def _readout(outputs: Mapping, prefix: str, targets: Optional[Tensor], pick: Any) -> Optional[Readout]:
    """The readout under ``prefix`` ("" for the shared head, "exit_" for separate heads), from logits if needed."""
    if prefix + PREDICTIONS in outputs and (prefix + NLL in outputs or targets is None):
        predictions, max_prob = pick(outputs[prefix + PREDICTIONS]), pick(outputs[prefix + MAX_PROB])
        return Readout(predictions, max_prob, pick(outputs.get(prefix + NLL)))
    logits = outputs.get(EXIT_LOGITS if prefix else LOGITS)
    return None if logits is None else readout_from_logits(pick(logits), targets)


def _targets(batch: Any) -> Optional[Tensor]:
    if isinstance(batch, Mapping):
        for key in ("labels", "label", "targets", "target"):
            if key in batch:
                return batch[key]
        return None
    if isinstance(batch, (tuple, list)) and len(batch) > 1:
        return batch[1]
    return None
