"""The one contract between modules and callbacks: what a validation step returns.

A LightningModule that wants the analysis callbacks to read its outputs (instead of attaching hooks) returns from
``validation_step`` / ``test_step`` / ``predict_step`` a dict with these keys:

- ``features``: ``(L, B, d)`` pooled residual-stream feature after each block, before any final norm.
- ``logits``: ``(L, B, C)`` the model's own final norm + classifier (the "shared head") applied to every layer.
- ``targets``: ``(B,)`` integer class labels (absent in ``predict``).
- ``exit_logits``: optional ``(L, B, C)`` logits of separate per-layer classifiers (multi-exit models).

Where the classes are a vocabulary, per-layer logits are too large to return: a step may then return, instead of
``logits``, the head's *readout* per layer and sample (computed in token chunks, see
:mod:`layerwise.engines.readout`): ``predictions`` ``(L, N)``, ``max_prob`` ``(L, N)``, ``nll``
``(L, N)`` (and ``exit_predictions``/``exit_max_prob``/``exit_nll`` for separate heads). Token-level models (every
predicted token is a sample) also return ``sample_index`` ``(N,)`` (the batch row of each sample, used to drop DDP
padding) and ``positions`` ``(N,)`` (its position in the sequence, used to subsample tokens).
"""

from collections.abc import Mapping
from typing import Any

FEATURES = "features"
LOGITS = "logits"
TARGETS = "targets"
EXIT_LOGITS = "exit_logits"
PREDICTIONS = "predictions"
MAX_PROB = "max_prob"
NLL = "nll"
EXIT_PREFIX = "exit_"
SAMPLE_INDEX = "sample_index"
POSITIONS = "positions"
# Detection (DetrLayerwise -> DetectionLayerAP): every decoder layer's class logits (L, B, Q, C+1) and normalised
# boxes (L, B, Q, 4), with the batch's DETR ``labels`` (a list of dicts).
LAYER_LOGITS = "layer_logits"
LAYER_BOXES = "layer_boxes"
DETECTION_LABELS = "labels"


def is_layer_outputs(obj: Any) -> bool:
    """Whether ``obj`` is a dict following the contract above."""
    return isinstance(obj, Mapping) and FEATURES in obj and (LOGITS in obj or PREDICTIONS in obj)


def check_layer_outputs(outputs: Mapping) -> None:
    """Raise a ValueError that prints the offending shapes if ``outputs`` breaks the contract."""
    features = outputs[FEATURES]
    scores = outputs[LOGITS] if LOGITS in outputs else outputs[PREDICTIONS]
    expected = 3 if LOGITS in outputs else 2
    if features.ndim != 3 or scores.ndim != expected or features.shape[:2] != scores.shape[:2]:
        name = "logits (L, B, C)" if LOGITS in outputs else "predictions (L, B)"
        raise ValueError(
            f"Expected features (L, B, d) and {name} with the same L and B, got features "
            f"{tuple(features.shape)} and {tuple(scores.shape)}."
        )
    targets = outputs.get(TARGETS)
    if targets is not None and tuple(targets.shape) != tuple(features.shape[1:2]):
        raise ValueError(f"Expected targets of shape (B,) = ({features.shape[1]},), got {tuple(targets.shape)}.")
