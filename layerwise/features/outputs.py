"""The one contract between modules and callbacks: what a validation step returns.

A LightningModule that wants the analysis callbacks to read its outputs (instead of attaching hooks) returns from
``validation_step`` / ``test_step`` / ``predict_step`` a dict with these keys:

- ``features``: ``(L, B, d)`` pooled residual-stream feature after each block, before any final norm.
- ``logits``: ``(L, B, C)`` the model's own final norm + classifier (the "shared head") applied to every layer.
- ``targets``: ``(B,)`` integer class labels (absent in ``predict``).
- ``exit_logits``: optional ``(L, B, C)`` logits of separate per-layer classifiers (multi-exit models).
"""

from collections.abc import Mapping
from typing import Any

FEATURES = "features"
LOGITS = "logits"
TARGETS = "targets"
EXIT_LOGITS = "exit_logits"


def is_layer_outputs(obj: Any) -> bool:
    """Whether ``obj`` is a dict following the contract above."""
    return isinstance(obj, Mapping) and FEATURES in obj and LOGITS in obj


def check_layer_outputs(outputs: Mapping) -> None:
    """Raise a ValueError that prints the offending shapes if ``outputs`` breaks the contract."""
    features, logits = outputs[FEATURES], outputs[LOGITS]
    if features.ndim != 3 or logits.ndim != 3 or features.shape[:2] != logits.shape[:2]:
        raise ValueError(
            f"Expected features (L, B, d) and logits (L, B, C) with the same L and B, got features "
            f"{tuple(features.shape)} and logits {tuple(logits.shape)}."
        )
    targets = outputs.get(TARGETS)
    if targets is not None and tuple(targets.shape) != tuple(features.shape[1:2]):
        raise ValueError(f"Expected targets of shape (B,) = ({features.shape[1]},), got {tuple(targets.shape)}.")
